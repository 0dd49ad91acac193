
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("explorer-data").textContent);
  var PAGE = 100, PREVIEW = 600;
  var stories = D.stories || [];
  var assocs = D.associations;
  var state = {design: "", model: "", language: "", cond: "", value: "", validity: "", extraction: "",
               search: "", assoc: null, shown: PAGE};
  var sort = {key: "n_models", dir: -1};

  function $(id) { return document.getElementById(id); }
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) { e.className = cls; }
    if (text !== undefined && text !== null) { e.textContent = String(text); }
    return e;
  }
  function num(n) { return (n === null || n === undefined) ? "\u2013" : Number(n).toLocaleString("en-US"); }
  function fix(x, d) { return (x === null || x === undefined) ? "\u2013" : Number(x).toFixed(d); }
  // Values from the run (model names, condition values, keys) are never used as keys of a plain
  // object: a model called "hasOwnProperty", "__proto__" or "constructor" would hit Object.prototype.
  // Sets hold seen values, and objects parsed from the JSON are read through own().
  function own(obj, key) {
    return (obj !== null && obj !== undefined && Object.prototype.hasOwnProperty.call(obj, key)) ? obj[key] : undefined;
  }
  function langLabel(code) { var n = own(D.languages, code); return n ? code + " (" + n + ")" : code; }
  function facetLabel(key) {
    var i = key.indexOf(":"), design = key.slice(0, i), name = key.slice(i + 1);
    if (design === "stereotales" && name !== "scenario" && name !== "scenario_category") {
      return design + " \u00b7 " + name + " (prompted attribute)";
    }
    return design + " \u00b7 " + name;
  }
  function uniq(values) {
    var seen = new Set(), out = [];
    values.forEach(function (v) { if (v !== null && v !== undefined && !seen.has(v)) { seen.add(v); out.push(v); } });
    return out.sort();
  }
  function fillSelect(select, values, label, keepFirst) {
    var current = select.value;
    while (select.options.length > (keepFirst ? 1 : 0)) { select.remove(select.options.length - 1); }
    values.forEach(function (v) {
      var o = document.createElement("option");
      o.value = v; o.textContent = label ? label(v) : v;
      select.appendChild(o);
    });
    select.value = values.indexOf(current) >= 0 ? current : "";
    return select.value;
  }

  // ---- header -------------------------------------------------------------------------------
  $("title").textContent = "storybias explorer \u2014 run " + (D.run || "?");
  $("summary").textContent = "Run \u201c" + (D.run || "?") + "\u201d: " + num(D.n_total) + " stories in the run; " +
    num(D.n_embedded) + " on this page. Built " + D.built_at + ".";
  if (D.n_embedded < D.n_total) {
    $("sample-note").textContent = "This page shows a sample: " + num(D.n_embedded) + " of " + num(D.n_total) +
      " stories, at most " + num(D.max_per_cell) + " per design \u00d7 model \u00d7 language (stories that exemplify " +
      "an association first, then the others; by sample index, then by prompt in a pseudo-random order that is the " +
      "same in every cell, so that a prompt tends to be on the page for every model and language). Counts below are " +
      "over the sample.";
  } else {
    $("sample-note").textContent = "Every story of the run is on this page.";
  }
  (D.notes || []).forEach(function (n) { $("notes").appendChild(el("li", null, n)); });

  var cellBody = document.querySelector("#cells-table tbody");
  (D.cells || []).forEach(function (c) {
    var tr = el("tr");
    tr.appendChild(el("td", null, c.design)); tr.appendChild(el("td", null, c.model));
    tr.appendChild(el("td", null, langLabel(c.language)));
    [c.n_stories, c.n_valid, c.n_extracted, c.n_parsed, c.n_embedded].forEach(function (v) { tr.appendChild(el("td", "num", num(v))); });
    cellBody.appendChild(tr);
  });

  // ---- stories --------------------------------------------------------------------------------
  function assocMatch(a, s) {
    return s.design === "stereotales" && a.models.indexOf(s.model) >= 0 &&
      (a.scope === "all" || s.language === a.scope) &&
      own(s.cond, "attribute") === a.base_attribute && own(s.cond, "value") === a.base_value &&
      s.x !== null && s.x.ok === true && own(s.x.demo, a.compared_attribute) === a.compared_value;
  }
  function haystack(s) {
    if (s._hay === undefined) {
      s._hay = (s.text + "\n" + s.prompt + "\n" + ((s.x && s.x.name) || "") + "\n" + s.id).toLowerCase();
    }
    return s._hay;
  }
  function matches(s) {
    if (state.design && s.design !== state.design) { return false; }
    if (state.model && s.model !== state.model) { return false; }
    if (state.language && s.language !== state.language) { return false; }
    if (state.cond) {
      var f = null;
      for (var i = 0; i < s.facets.length; i++) { if (s.facets[i][0] === state.cond) { f = s.facets[i]; break; } }
      if (!f || (state.value && f[1] !== state.value)) { return false; }
    }
    if (state.validity === "valid" && s.valid !== true) { return false; }
    if (state.validity === "invalid" && s.valid !== false) { return false; }
    if (state.extraction === "extracted" && !s.x) { return false; }
    if (state.extraction === "parsed" && !(s.x && s.x.ok)) { return false; }
    if (state.extraction === "failed" && !(s.x && !s.x.ok)) { return false; }
    if (state.extraction === "none" && s.x) { return false; }
    if (state.search && haystack(s).indexOf(state.search) < 0) { return false; }
    if (state.assoc && !assocMatch(state.assoc, s)) { return false; }
    return true;
  }

  function field(dl, name, value) {
    if (value === null || value === undefined || value === "" || (Array.isArray(value) && !value.length)) { return; }
    dl.appendChild(el("dt", null, name));
    dl.appendChild(el("dd", null, Array.isArray(value) ? value.join(", ") : value));
  }
  // columnPrompt: the card is in a compare column that shows this prompt above it (omitted: in the list,
  // where the card has a "compare" button).
  function storyCard(s, columnPrompt) {
    var card = el("article", "story");
    card.setAttribute("data-story-id", s.id);
    var head = el("header");
    head.appendChild(el("span", "badge", s.design));
    head.appendChild(el("span", "badge", s.model));
    head.appendChild(el("span", "badge", langLabel(s.language)));
    if (s.valid === true) { head.appendChild(el("span", "badge valid", "valid")); }
    else if (s.valid === false) { head.appendChild(el("span", "badge invalid", "invalid: " + (s.invalid_reason || "?"))); }
    else { head.appendChild(el("span", "badge", "validity unknown")); }
    head.appendChild(el("span", "story-id", (s.prompt_id || "") + " \u00b7 sample " + s.sample + " \u00b7 " + s.id));
    if (columnPrompt === undefined && s.prompt_key !== null && s.prompt_key !== undefined) {
      var cmpBtn = el("button", "compare", "compare");
      cmpBtn.type = "button";
      cmpBtn.title = "this prompt\u2019s stories of two models or languages side by side";
      cmpBtn.addEventListener("click", function () { openCompare(s.prompt_key, s.model, s.language); });
      head.appendChild(cmpBtn);
    }
    card.appendChild(head);
    var conds = Object.keys(s.cond).map(function (k) { return k + " = " + s.cond[k]; });
    if (conds.length) { card.appendChild(el("p", "conds", conds.join(" \u00b7 "))); }
    if (columnPrompt === undefined || s.prompt !== columnPrompt) {
      var pd = el("details", "prompt");
      pd.appendChild(el("summary", null, "prompt"));
      pd.appendChild(el("div", "prompt-text", s.prompt));
      card.appendChild(pd);
    }
    var text = el("div", "story-text");
    var long = s.text.length > PREVIEW;
    text.textContent = long ? s.text.slice(0, PREVIEW) + "\u2026" : (s.text || "(empty)");
    card.appendChild(text);
    if (long) {
      var toggle = el("button", "toggle", "show full story (" + num(s.text.length) + " characters)");
      toggle.type = "button";
      toggle.setAttribute("aria-expanded", "false");
      toggle.addEventListener("click", function () {
        var open = toggle.getAttribute("aria-expanded") === "true";
        text.textContent = open ? s.text.slice(0, PREVIEW) + "\u2026" : s.text;
        toggle.textContent = open ? "show full story (" + num(s.text.length) + " characters)" : "collapse";
        toggle.setAttribute("aria-expanded", open ? "false" : "true");
      });
      card.appendChild(toggle);
    }
    var ex = el("div", "extraction");
    if (!s.x) {
      ex.appendChild(el("span", "not-extracted", "not extracted"));
    } else {
      if (!s.x.ok) { ex.appendChild(el("p", "invalid", "extraction did not parse (excluded from statistics)")); }
      var dl = el("dl");
      field(dl, "protagonist", [s.x.name || "(unnamed)", s.x.gender_fine || s.x.gender].filter(Boolean).join(", "));
      field(dl, "explicit label", s.x.explicit);
      Object.keys(s.x.demo).sort().forEach(function (k) { field(dl, k, s.x.demo[k]); });
      field(dl, "adjectives", s.x.adjectives);
      field(dl, "settings", s.x.settings);
      field(dl, "cultural refs", s.x.refs);
      field(dl, "markers", s.x.markers.map(function (m) {
        return (m.text_en || m.text || "?") + (m.category ? " [" + m.category + "]" : "") + (m.keep === false ? " (removed)" : "");
      }));
      if (s.x.cut) { field(dl, "note", "story cut to fit the extractor's context"); }
      field(dl, "extractors", s.x.extractors);
      ex.appendChild(dl);
    }
    card.appendChild(ex);
    return card;
  }

  function renderStories() {
    var list = stories.filter(matches);
    var count = $("story-count");
    count.textContent = num(list.length) + " of " + num(stories.length) + " stories shown";
    count.setAttribute("data-matching", String(list.length));
    count.setAttribute("data-total", String(stories.length));
    var n = Math.min(list.length, state.shown);
    var box = $("stories");
    var frag = document.createDocumentFragment();
    for (var i = 0; i < n; i++) { frag.appendChild(storyCard(list[i])); }
    box.replaceChildren(frag);
    $("page-note").textContent = list.length > n ? "(listing the first " + num(n) + ")" : "";
    var more = $("more");
    more.hidden = list.length <= n;
    more.textContent = "show " + num(Math.min(PAGE, list.length - n)) + " more";
  }

  // ---- filters ------------------------------------------------------------------------------
  var selects = {design: $("f-design"), model: $("f-model"), language: $("f-language"), cond: $("f-cond"),
                 value: $("f-value"), validity: $("f-validity"), extraction: $("f-extraction")};
  fillSelect(selects.design, uniq(stories.map(function (s) { return s.design; })), null, true);
  fillSelect(selects.model, uniq(stories.map(function (s) { return s.model; })), null, true);
  fillSelect(selects.language, uniq(stories.map(function (s) { return s.language; })), langLabel, true);
  function refreshConditions() {
    var pool = stories.filter(function (s) { return !state.design || s.design === state.design; });
    var keys = uniq([].concat.apply([], pool.map(function (s) { return s.facets.map(function (f) { return f[0]; }); })));
    state.cond = fillSelect(selects.cond, keys, facetLabel, true);
    var vals = state.cond ? uniq([].concat.apply([], pool.map(function (s) {
      return s.facets.filter(function (f) { return f[0] === state.cond; }).map(function (f) { return f[1]; });
    }))) : [];
    state.value = fillSelect(selects.value, vals, null, true);
    selects.value.disabled = !state.cond;
  }
  refreshConditions();
  Object.keys(selects).forEach(function (k) {
    selects[k].addEventListener("change", function () {
      state[k] = selects[k].value;
      if (k === "design" || k === "cond") { refreshConditions(); }
      state.shown = PAGE;
      renderStories();
    });
  });
  $("f-search").addEventListener("input", function () {
    state.search = $("f-search").value.trim().toLowerCase();
    state.shown = PAGE;
    renderStories();
  });
  function resetFilters() {
    Object.keys(selects).forEach(function (k) { state[k] = ""; selects[k].value = ""; });
    state.search = ""; $("f-search").value = "";
    refreshConditions();
  }
  $("f-reset").addEventListener("click", function () { resetFilters(); setAssoc(null); });
  $("more").addEventListener("click", function () { state.shown += PAGE; renderStories(); });

  // ---- compare: one prompt, two (model, language) sides (BiasedTales-ML, Figs. 8-9) ------------
  var byPrompt = new Map();  // prompt key -> its stories on the page (a Map: keys are data)
  stories.forEach(function (s) {
    if (s.prompt_key === null || s.prompt_key === undefined) { return; }
    if (!byPrompt.has(s.prompt_key)) { byPrompt.set(s.prompt_key, []); }
    byPrompt.get(s.prompt_key).push(s);
  });
  byPrompt.forEach(function (list) {
    list.sort(function (a, b) { return (a.sample - b.sample) || (a.id < b.id ? -1 : (a.id > b.id ? 1 : 0)); });
  });
  var compare = {key: "", pairs: [], sides: [0, 0]};  // sides: indices into pairs ({model, language, cell})
  function promptLabel(s) {
    var id = s.prompt_id || "?";
    return id.indexOf(s.design + "/") === 0 ? id : s.design + ": " + id;
  }
  function pairLabel(p) { return p.model + " \u00b7 " + langLabel(p.language); }
  function pairIndex(model, language) {
    for (var i = 0; i < compare.pairs.length; i++) {
      if (compare.pairs[i].model === model && compare.pairs[i].language === language) { return i; }
    }
    return -1;
  }
  function defaultRight(left) {
    var pairs = compare.pairs, l = pairs[left];
    var models = uniq(pairs.map(function (p) { return p.model; }));
    if (models.length > 1) {
      var next = models[(models.indexOf(l.model) + 1) % models.length];
      var same = pairIndex(next, l.language);
      if (same >= 0) { return same; }
      for (var i = 0; i < pairs.length; i++) { if (pairs[i].model === next) { return i; } }
    }
    var langs = uniq(pairs.filter(function (p) { return p.model === l.model; }).map(function (p) { return p.language; }));
    return pairIndex(l.model, langs[(langs.indexOf(l.language) + 1) % langs.length]);
  }
  function missingText(p) {
    var capped = p.cell && p.cell.n_embedded < p.cell.n_stories;
    return "no story of " + p.model + " in " + langLabel(p.language) + " for this prompt " + (capped
      ? "in this page (the page embeds at most " + num(D.max_per_cell) + " per cell)"
      : "in this run");
  }
  function compareColumn(p, side) {
    var col = el("div", "compare-col");
    col.setAttribute("data-side", side);
    col.setAttribute("data-model", p.model);
    col.setAttribute("data-language", p.language);
    col.appendChild(el("h3", null, pairLabel(p)));
    var list = (byPrompt.get(compare.key) || []).filter(function (s) {
      return s.model === p.model && s.language === p.language;
    });
    if (!list.length) {
      col.appendChild(el("p", "compare-missing", missingText(p)));
      return col;
    }
    col.appendChild(el("p", "muted", num(list.length) + (list.length === 1 ? " story" : " stories") + "; the prompt:"));
    col.appendChild(el("div", "prompt-text", list[0].prompt));
    list.forEach(function (s) { col.appendChild(storyCard(s, list[0].prompt)); });
    return col;
  }
  function renderCompare() {
    var cols = $("compare-cols");
    cols.hidden = !compare.key;
    $("c-left").disabled = $("c-right").disabled = !compare.key;
    $("c-clear").hidden = !compare.key;
    if (!compare.key) {
      $("compare-note").textContent = "Pick a prompt, or click \u201ccompare\u201d on a story below: its prompt\u2019s " +
        "stories of two models (or two languages) side by side, one column each.";
      cols.replaceChildren();
      return;
    }
    var first = byPrompt.get(compare.key)[0];
    var conds = Object.keys(first.cond).map(function (k) { return k + " = " + first.cond[k]; });
    $("compare-note").textContent = "Prompt " + promptLabel(first) + (conds.length ? " (" + conds.join(", ") + ")" : "") +
      ": " + num(byPrompt.get(compare.key).length) + " stories on this page, over all models and languages.";
    var frag = document.createDocumentFragment();
    frag.appendChild(compareColumn(compare.pairs[compare.sides[0]], "left"));
    frag.appendChild(compareColumn(compare.pairs[compare.sides[1]], "right"));
    cols.replaceChildren(frag);
  }
  // Show prompt `key`; `model`/`language`: the left side (null: keep the sides if the design has them).
  function setCompare(key, model, language) {
    var old = compare.pairs, oldSides = compare.sides.slice();
    compare.key = byPrompt.has(key) ? key : "";
    $("c-prompt").value = compare.key;
    if (!compare.key) { compare.pairs = []; renderCompare(); return; }
    var design = byPrompt.get(compare.key)[0].design;
    compare.pairs = (D.cells || []).filter(function (c) { return c.design === design; }).map(function (c) {
      return {model: c.model, language: c.language, cell: c};
    });
    var kept = oldSides.map(function (i) { return old[i] ? pairIndex(old[i].model, old[i].language) : -1; });
    var left = model !== null ? pairIndex(model, language) : kept[0];
    if (left < 0) {
      var firstStory = byPrompt.get(compare.key)[0];
      left = Math.max(0, pairIndex(firstStory.model, firstStory.language));
    }
    var right = (model === null && kept[0] === left && kept[1] >= 0) ? kept[1] : defaultRight(left);
    compare.sides = [left, right < 0 ? left : right];
    [$("c-left"), $("c-right")].forEach(function (select, i) {
      fillSelect(select, compare.pairs.map(function (p, j) { return String(j); }), function (v) {
        return pairLabel(compare.pairs[Number(v)]);
      }, false);
      select.value = String(compare.sides[i]);
    });
    renderCompare();
  }
  function openCompare(key, model, language) {
    setCompare(key, model, language);
    $("compare-section").scrollIntoView();
  }
  var promptKeys = Array.from(byPrompt.keys()).sort();
  fillSelect($("c-prompt"), promptKeys, function (k) {
    var list = byPrompt.get(k);
    return promptLabel(list[0]) + " (" + num(list.length) + " on this page)";
  }, true);
  $("c-prompt").addEventListener("change", function () { setCompare($("c-prompt").value, null, null); });
  [$("c-left"), $("c-right")].forEach(function (select, i) {
    select.addEventListener("change", function () { compare.sides[i] = Number(select.value); renderCompare(); });
  });
  $("c-clear").addEventListener("click", function () { setCompare("", null, null); });
  renderCompare();

  // ---- associations -------------------------------------------------------------------------
  function assocLabel(a) {
    return a.base_attribute + " = " + a.base_value + " \u2192 " + a.compared_attribute + " = " + a.compared_value;
  }
  function setAssoc(a) {
    state.assoc = a;
    state.shown = PAGE;
    var box = $("assoc-filter");
    box.hidden = !a;
    $("assoc-filter-text").textContent = a ? "Example stories of " + assocLabel(a) + " (scope " + a.scope +
      "; models " + a.models.join(", ") + "): prompted " + a.base_attribute + " = " + a.base_value +
      ", extracted " + a.compared_attribute + " = " + a.compared_value + "." : "";
    document.querySelectorAll("#assoc-body tr").forEach(function (tr) {
      tr.classList.toggle("active", !!a && tr.getAttribute("data-index") === String(a.index));
    });
    renderStories();
  }
  $("assoc-clear").addEventListener("click", function () { setAssoc(null); });

  function cmp(a, b, key, dir) {
    var x = a[key], y = b[key];
    if (x === null || x === undefined) { return (y === null || y === undefined) ? 0 : 1; }
    if (y === null || y === undefined) { return -1; }
    return dir * (x - y);
  }
  function sortedAssocs(list) {
    var second = sort.key === "mean_lift" ? "n_models" : "mean_lift";
    return list.slice().sort(function (a, b) {
      return cmp(a, b, sort.key, sort.dir) || cmp(a, b, second, -1) || (a.index - b.index);
    });
  }
  function renderAssocs() {
    var scope = $("assoc-scope").value, harmful = $("assoc-harmful").checked;
    var list = sortedAssocs(assocs.filter(function (a) {
      return (!scope || a.scope === scope) && (!harmful || a.harmful === true);
    }));
    document.querySelectorAll("#assoc-table th[data-sort]").forEach(function (th) {
      var key = th.getAttribute("data-sort");
      if (key === sort.key) { th.setAttribute("aria-sort", sort.dir < 0 ? "descending" : "ascending"); }
      else { th.removeAttribute("aria-sort"); }
    });
    var body = $("assoc-body");
    var frag = document.createDocumentFragment();
    list.forEach(function (a) {
      var tr = el("tr");
      tr.setAttribute("data-association-id", a.id);
      tr.setAttribute("data-scope", a.scope);
      tr.setAttribute("data-index", String(a.index));
      if (state.assoc && state.assoc.index === a.index) { tr.classList.add("active"); }
      tr.appendChild(el("td", null, a.scope === "all" ? "all languages" : langLabel(a.scope)));
      var label = el("td");
      label.appendChild(el("div", null, assocLabel(a)));
      if (a.published === true) { label.appendChild(el("div", "muted published", "published by StereoTales")); }
      if (a.per_model && a.per_model.length) {
        var det = el("details");
        det.appendChild(el("summary", "muted", "per model"));
        var ul = el("ul");
        a.per_model.forEach(function (r) {
          ul.appendChild(el("li", null, r.model + ": " + num(r.count) + " of " + num(r.row_total) + " (" +
            fix(r.fraction, 3) + "), lift " + fix(r.lift, 2) + ", adjusted p " +
            (r.p_adjusted === null || r.p_adjusted === undefined ? "\u2013" : Number(r.p_adjusted).toPrecision(2)) +
            (r.significant ? ", significant" : "")));
        });
        det.appendChild(ul);
        label.appendChild(det);
      }
      tr.appendChild(label);
      var models = el("td", "num", num(a.n_models));
      models.title = a.models.join(", ");
      models.appendChild(el("div", "muted", a.models.join(", ")));
      tr.appendChild(models);
      tr.appendChild(el("td", "num", fix(a.mean_fraction, 3)));
      tr.appendChild(el("td", "num", fix(a.mean_lift, 2)));
      tr.appendChild(el("td", "num", a.median_harm === null ? "not rated" : fix(a.median_harm, 1)));
      tr.appendChild(el("td", "num", num(a.n_ratings)));
      tr.appendChild(el("td", "num", fix(a.share_realistic, 2)));
      tr.appendChild(el("td", null, a.harmful === true ? "yes" : (a.harmful === false ? "no" : "\u2013")));
      var cell = el("td");
      var shown = stories.filter(function (s) { return assocMatch(a, s); }).length;
      var btn = el("button", "assoc-show", num(shown) + " stories");
      btn.type = "button";
      btn.title = num(shown) + " example stories on this page, " + num(a.n_examples) + " in the run";
      btn.addEventListener("click", function () {
        resetFilters();
        setAssoc(a);
        $("stories-section").scrollIntoView();
      });
      cell.appendChild(btn);
      tr.appendChild(cell);
      frag.appendChild(tr);
    });
    body.replaceChildren(frag);
    $("assoc-count").textContent = num(list.length) + " of " + num(assocs.length) + " associations";
  }

  if (assocs === null || assocs === undefined) {
    $("assoc-note").textContent = "No association table for this run: associations_shared.parquet is not in the " +
      "run's data folder yet (stage 04: make associations). Stories can still be browsed below.";
  } else if (!assocs.length) {
    $("assoc-note").textContent = "Stage 04 found no association shared across models in this run.";
  } else {
    $("assoc-note").textContent = "Click a column title to sort (again to reverse); \u201cstories\u201d lists the " +
      "association\u2019s example stories on this page: its models" + "\u2019 stories (in its language unless the scope is all) " +
      "prompted with the base value whose parsed extraction has the compared value." +
      (D.has_values ? "" : " Per-model values: associations_values.parquet is missing.") +
      (D.published ? " Compared with StereoTales\u2019 published associations (" + D.published.mode.replace("_", " ") +
        "): " + num(D.published.reproduced) + " of " + num(D.published.tested) + " tested ones reproduced, " +
        num(D.published.not_published) + " significant associations of this run not published." : "");
    $("assoc-controls").hidden = false;
    $("assoc-table").hidden = false;
    fillSelect($("assoc-scope"), uniq(assocs.map(function (a) { return a.scope; })), function (v) {
      return v === "all" ? "all languages" : langLabel(v);
    }, true);
    $("assoc-scope").addEventListener("change", renderAssocs);
    $("assoc-harmful").addEventListener("change", renderAssocs);
    document.querySelectorAll("#assoc-table button.sort").forEach(function (b) {
      b.addEventListener("click", function () {
        var key = b.getAttribute("data-sort");
        if (sort.key === key) { sort.dir = -sort.dir; } else { sort.key = key; sort.dir = -1; }
        renderAssocs();
      });
    });
    renderAssocs();
  }
  renderStories();
  document.body.setAttribute("data-ready", "1");
})();
