/* The course's interactive figures (transformer_course.interactive writes their data into the page).
 *
 * Each <figure data-tc-figure> holds its data as JSON: controls (sliders and menus) and either every
 * frame, keyed by the controls' value indices joined with "|", or the name of a function below that
 * computes a frame in the browser. This script draws the chosen frame as SVG and reads its one-sentence
 * summary out through an aria-live region. It uses no library and loads nothing: the site works offline.
 * Without JavaScript, in print and in Jupyter the static image with alt text stays in place.
 */
(function () {
  "use strict";
  const SVG = "http://www.w3.org/2000/svg";
  const PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442"];
  // viridis at nine evenly spaced stops
  const VIRIDIS = ["#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c", "#28ae80", "#5ec962", "#addc30", "#fde725"];
  const M = { left: 62, right: 14, top: 28, bottom: 48 };
  let W = 460, H = 320;  // the drawing's size in SVG units: set per panel by drawPanel

  function el(name, attrs, parent) {
    const node = document.createElementNS(SVG, name);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (parent) parent.appendChild(node);
    return node;
  }
  function text(parent, x, y, s, attrs) {
    const t = el("text", Object.assign({ x: x, y: y }, attrs || {}), parent);
    t.textContent = s;
    return t;
  }
  function fmt(v) {
    const a = Math.abs(v);
    if (a === 0) return "0";
    if (a >= 1e4 || a < 1e-3) return v.toExponential(0).replace("e+", "e");
    return String(Number(v.toPrecision(3)));
  }
  function hexToRgb(h) { return [1, 3, 5].map(i => parseInt(h.slice(i, i + 2), 16)); }
  function viridis(t) {
    t = Math.min(1, Math.max(0, t)) * (VIRIDIS.length - 1);
    const i = Math.min(VIRIDIS.length - 2, Math.floor(t)), f = t - i;
    const a = hexToRgb(VIRIDIS[i]), b = hexToRgb(VIRIDIS[i + 1]);
    return "rgb(" + a.map((c, k) => Math.round(c + f * (b[k] - c))).join(",") + ")";
  }

  // An axis maps data to pixels; ticks are "nice" numbers (or powers of ten on a log axis).
  function axis(lo, hi, log, p0, p1) {
    if (log) { lo = Math.log10(lo); hi = Math.log10(hi); }
    if (hi === lo) { hi = lo + 1; }
    const map = v => p0 + ((log ? Math.log10(v) : v) - lo) / (hi - lo) * (p1 - p0);
    let ticks = [];
    if (log && hi - lo >= 1) {
      for (let e = Math.ceil(lo - 1e-9); e <= hi + 1e-9; e++) ticks.push(Math.pow(10, e));
      if (ticks.length < 3) {
        const more = [];
        for (let e = Math.floor(lo); e <= hi; e++) for (const m of [2, 5]) {
          const v = m * Math.pow(10, e);
          if (Math.log10(v) >= lo - 1e-9 && Math.log10(v) <= hi + 1e-9) more.push(v);
        }
        ticks = ticks.concat(more).sort((a, b) => a - b);
      }
    } else {
      const a = log ? Math.pow(10, lo) : lo, b = log ? Math.pow(10, hi) : hi;
      const raw = (b - a) / 5, mag = Math.pow(10, Math.floor(Math.log10(raw)));
      const step = [1, 2, 2.5, 5, 10].map(m => m * mag).find(s => s >= raw);
      for (let v = Math.ceil(a / step - 1e-9) * step; v <= b + 1e-9 * step; v += step) {
        ticks.push(Math.abs(v) < 1e-12 * step ? 0 : v);
      }
    }
    return { map: map, ticks: ticks };
  }
  function extent(values, log) {
    const v = values.filter(x => Number.isFinite(x) && (!log || x > 0));
    return [Math.min.apply(null, v), Math.max.apply(null, v)];
  }
  function frameAxes(svg, panel, xa, ya, xlabels) {
    el("rect", { x: M.left, y: M.top, width: W - M.left - M.right, height: H - M.top - M.bottom,
      fill: "none", stroke: "#444", "stroke-width": 1 }, svg);
    if (!xlabels) {
      for (const t of xa.ticks) {
        const x = xa.map(t);
        el("line", { x1: x, x2: x, y1: H - M.bottom, y2: H - M.bottom + 4, stroke: "#444" }, svg);
        text(svg, x, H - M.bottom + 16, fmt(t), { "text-anchor": "middle", class: "tc-tick" });
      }
    }
    for (const t of ya.ticks) {
      const y = ya.map(t);
      el("line", { x1: M.left - 4, x2: M.left, y1: y, y2: y, stroke: "#444" }, svg);
      el("line", { x1: M.left, x2: W - M.right, y1: y, y2: y, stroke: "#e3e3e3" }, svg);
      text(svg, M.left - 7, y + 4, fmt(t), { "text-anchor": "end", class: "tc-tick" });
    }
    text(svg, (M.left + W - M.right) / 2, H - 8, panel.xlabel || "", { "text-anchor": "middle", class: "tc-label" });
    const yl = text(svg, 0, 0, panel.ylabel || "", { "text-anchor": "middle", class: "tc-label" });
    yl.setAttribute("transform", "translate(14," + (M.top + H - M.bottom) / 2 + ") rotate(-90)");
  }

  function drawLines(svg, panel, values) {
    const shown = panel.series.map(s => {
      const n = s.upto ? Math.max(0, Math.min(s.x.length, Math.round(values[s.upto]))) : s.x.length;
      return Object.assign({}, s, { x: s.x.slice(0, n), y: s.y.slice(0, n) });
    });
    const xs = panel.xlim || extent([].concat.apply([], panel.series.map(s => s.x)), panel.xlog);
    const ys = panel.ylim || extent([].concat.apply([], panel.series.map(s => s.y)), panel.ylog);
    let x0 = M.left, x1 = W - M.right, y0 = H - M.bottom, y1 = M.top;
    if (panel.square) {  // equal units on both axes, centred
      const sx = (x1 - x0) / (xs[1] - xs[0]), sy = (y0 - y1) / (ys[1] - ys[0]);
      const s = Math.min(sx, sy);
      const cx = (x0 + x1) / 2, cy = (y0 + y1) / 2;
      x0 = cx - s * (xs[1] - xs[0]) / 2; x1 = cx + s * (xs[1] - xs[0]) / 2;
      y0 = cy + s * (ys[1] - ys[0]) / 2; y1 = cy - s * (ys[1] - ys[0]) / 2;
    }
    const xa = axis(xs[0], xs[1], panel.xlog, x0, x1), ya = axis(ys[0], ys[1], panel.ylog, y0, y1);
    frameAxes(svg, panel, xa, ya);
    const clip = "tc-clip-" + Math.random().toString(36).slice(2);
    const defs = el("defs", {}, svg);
    el("rect", { x: M.left, y: M.top, width: W - M.left - M.right, height: H - M.top - M.bottom }, el("clipPath", { id: clip }, defs));
    const g = el("g", { "clip-path": "url(#" + clip + ")" }, svg);
    shown.forEach((s, i) => {
      const colour = PALETTE[i % PALETTE.length];
      const pts = s.x.map((x, k) => [xa.map(x), ya.map(s.y[k])]).filter(p => Number.isFinite(p[0]) && Number.isFinite(p[1]));
      if (s.style !== "points" && pts.length > 1) {
        el("polyline", { points: pts.map(p => p[0].toFixed(1) + "," + p[1].toFixed(1)).join(" "), fill: "none",
          stroke: colour, "stroke-width": 2, "stroke-dasharray": s.dashed ? "6 4" : "none", class: "tc-series" }, g);
      }
      if (s.style !== "line") {
        for (const p of pts) el("circle", { cx: p[0].toFixed(1), cy: p[1].toFixed(1), r: 3.2, fill: colour, class: "tc-point" }, g);
      }
    });
    if (panel.series.length > 1) {  // legend on a white box, in the corner that covers the fewest points
      const width = 30 + 6.4 * Math.max.apply(null, panel.series.map(s => s.name.length));
      const height = 15 * panel.series.length + 6;
      const all = [].concat.apply([], panel.series.map(s => s.x.map((x, k) => [xa.map(x), ya.map(s.y[k])])));
      const corners = [[W - M.right - width - 6, M.top + 2], [M.left + 4, M.top + 2],
        [W - M.right - width - 6, H - M.bottom - height - 2], [M.left + 4, H - M.bottom - height - 2]];
      const covered = c => all.filter(p => p[0] >= c[0] - 4 && p[0] <= c[0] + width + 8 && p[1] >= c[1] - 4 && p[1] <= c[1] + height + 4).length;
      const best = corners.reduce((a, b) => (covered(b) < covered(a) ? b : a));
      const lg = el("g", { class: "tc-legend" }, svg);
      el("rect", { x: best[0], y: best[1], width: width + 6, height: height, fill: "white", "fill-opacity": 0.9, stroke: "#ccc" }, lg);
      panel.series.forEach((s, i) => {
        const colour = PALETTE[i % PALETTE.length], x = best[0] + 4, y = best[1] + 14 + 15 * i;
        el("line", { x1: x, x2: x + 18, y1: y - 4, y2: y - 4, stroke: colour, "stroke-width": 2,
          "stroke-dasharray": s.dashed ? "6 4" : "none" }, lg);
        if (s.style !== "line") el("circle", { cx: x + 9, cy: y - 4, r: 3, fill: colour }, lg);
        text(lg, x + 23, y, s.name, { class: "tc-legend-text" });
      });
    }
  }

  function drawHeatmap(svg, panel) {
    const rows = panel.z.length, cols = panel.z[0].length;
    const size = Math.min((W - M.left - M.right) / cols, (H - M.top - M.bottom) / rows);
    const left = M.left, top = M.top;
    const g = el("g", {}, svg);
    panel.z.forEach((row, n) => row.forEach((v, m) => {
      const t = (v - panel.vmin) / (panel.vmax - panel.vmin);
      const r = el("rect", { x: (left + m * size).toFixed(2), y: (top + n * size).toFixed(2), width: (size + 0.3).toFixed(2),
        height: (size + 0.3).toFixed(2), fill: viridis(t), class: "tc-cell" }, g);
      const title = el("title", {}, r);
      title.textContent = panel.ylabels[n] + " → " + panel.xlabels[m] + ": " + fmt(v);
    }));
    const fs = Math.max(5, Math.min(11, size * 0.9));
    panel.xlabels.forEach((s, m) => text(svg, left + (m + 0.5) * size, top + rows * size + fs + 2, s,
      { "text-anchor": "middle", "font-size": fs, class: "tc-tick" }));
    panel.ylabels.forEach((s, n) => text(svg, left - 3, top + (n + 0.5) * size + fs / 3, s,
      { "text-anchor": "end", "font-size": fs, class: "tc-tick" }));
    text(svg, left + cols * size / 2, H - 8, panel.xlabel || "", { "text-anchor": "middle", class: "tc-label" });
    const yl = text(svg, 0, 0, panel.ylabel || "", { "text-anchor": "middle", class: "tc-label" });
    yl.setAttribute("transform", "translate(14," + (top + rows * size / 2) + ") rotate(-90)");
    // colour scale
    const x = Math.min(W - 34, left + cols * size + 16);
    for (let k = 0; k < 20; k++) {
      el("rect", { x: x, y: top + (19 - k) * (rows * size / 20), width: 12, height: rows * size / 20 + 0.5,
        fill: viridis(k / 19) }, svg);
    }
    text(svg, x + 14, top + 8, fmt(panel.vmax), { class: "tc-tick" });
    text(svg, x + 14, top + rows * size, fmt(panel.vmin), { class: "tc-tick" });
  }

  function drawBars(svg, panel) {
    const n = panel.values.length;
    const ymax = panel.ymax || Math.max.apply(null, panel.values) * 1.1 || 1;
    const xa = { map: k => M.left + (k + 0.5) * (W - M.left - M.right) / n, ticks: [] };
    const ya = axis(0, ymax, false, H - M.bottom, M.top);
    frameAxes(svg, panel, xa, ya, panel.labels);
    const bw = 0.8 * (W - M.left - M.right) / n;
    panel.values.forEach((v, k) => {
      const y = ya.map(Math.min(v, ymax));
      const r = el("rect", { x: (xa.map(k) - bw / 2).toFixed(1), y: y.toFixed(1), width: bw.toFixed(1),
        height: Math.max(0, H - M.bottom - y).toFixed(1), fill: PALETTE[0], class: "tc-bar" }, svg);
      el("title", {}, r).textContent = panel.labels[k] + ": " + fmt(v);
      text(svg, xa.map(k), H - M.bottom + 14, panel.labels[k], { "text-anchor": "middle", class: "tc-tick" });
    });
  }

  function drawPanel(panel, values) {
    const large = panel.type === "heatmap" && panel.z.length > 16;  // room for one label per row
    W = large ? 620 : 460;
    H = large ? 600 : 320;
    const svg = el("svg", { viewBox: "0 0 " + W + " " + H, class: "tc-panel" + (large ? " tc-panel-large" : ""), role: "img" });
    svg.setAttribute("aria-label", panel.title);
    el("rect", { x: 0, y: 0, width: W, height: H, fill: "white" }, svg);
    text(svg, W / 2, 17, panel.title, { "text-anchor": "middle", class: "tc-title" });
    if (panel.type === "lines") drawLines(svg, panel, values);
    else if (panel.type === "heatmap") drawHeatmap(svg, panel);
    else if (panel.type === "bars") drawBars(svg, panel);
    else throw new Error("course-figures: unknown panel type " + panel.type);
    return svg;
  }

  // Frames the browser computes (figures with too many settings to list). Each mirrors one function of
  // the package, named here; the site tests compare the two at many settings.
  const compute = {
    // transformer_course.language_models.kv_cache_bytes: keys and values of every layer, every
    // key-value head, every position of every sequence in the batch.
    kv_cache: function (v, data) {
      const kv = Math.min(v.kv_heads, v.heads);  // a query head reads one key-value head: H_kv <= H
      const size = data.bytes_per_number[v.dtype];
      const perToken = 2 * v.layers * kv * v.d_head * size;  // one position of one sequence
      const bytes = perToken * v.batch * v.context;
      const mib = t => perToken * v.batch * t / Math.pow(2, 20);
      const curves = [{ name: "H_kv = " + kv, x: data.contexts, y: data.contexts.map(mib), style: "line" }];
      if (kv < v.heads) {
        curves.push({ name: "H_kv = H = " + v.heads, x: data.contexts, style: "line", dashed: true,
          y: data.contexts.map(t => mib(t) * v.heads / kv) });
      }
      curves.push({ name: "this setting", x: [v.context], y: [mib(v.context)], style: "points" });
      const match = (data.measured || []).find(m => ["layers", "heads", "kv_heads", "d_head", "context",
        "batch", "dtype"].every(k => m[k] === v[k]));
      return {
        bytes: bytes,
        panels: [{ type: "lines", title: "KV-cache size against the context", xlabel: "context C (tokens)",
          ylabel: "MiB", xlog: true, ylog: true, series: curves }],
        summary: v.layers + " layers, " + kv + " key-value heads of width " + v.d_head + ", context " +
          v.context + ", batch " + v.batch + ", " + v.dtype + ": " + bytes.toLocaleString("en-US") +
          " bytes = " + fmt(bytes / Math.pow(2, 30)) + " GiB, " + perToken.toLocaleString("en-US") +
          " bytes per token" + (kv < v.heads ? " (" + v.heads / kv + " times less than H_kv = H)" : "") +
          (v.kv_heads > v.heads ? "; H_kv is at most H, so H_kv = " + kv : "") +
          (match ? "; the cache filled on this page measured " + match.bytes.toLocaleString("en-US") + " bytes" : "") + ".",
      };
    },
  };

  function build(figure) {
    if (figure.dataset.built) return;  // once, however often the script is loaded
    figure.dataset.built = "yes";
    const spec = JSON.parse(figure.querySelector("script.tc-fig-data").textContent);
    const live = figure.querySelector(".tc-fig-live");
    const index = {}, values = {};
    const controls = document.createElement("div");
    controls.className = "tc-fig-controls";
    const panels = document.createElement("div");
    panels.className = "tc-fig-panels";
    const summary = document.createElement("p");
    summary.className = "tc-fig-summary";
    summary.setAttribute("aria-live", "polite");
    summary.id = figure.id + "-summary";

    function frame() {
      if (spec.compute) {
        if (!compute[spec.compute]) throw new Error("course-figures: no function " + spec.compute);
        return compute[spec.compute](values, spec.data || {});
      }
      const key = spec.controls.filter(c => !c.reveal).map(c => index[c.name]).join("|");
      const f = spec.frames[key];
      if (!f) throw new Error("course-figures: " + spec.name + " has no frame " + key);
      return f;
    }
    function render() {
      const f = frame();
      panels.replaceChildren.apply(panels, f.panels.map(p => drawPanel(p, values)));
      panels.querySelectorAll("svg").forEach(s => s.setAttribute("aria-describedby", summary.id));
      const reveal = spec.controls.find(c => c.reveal);
      summary.textContent = Array.isArray(f.summary) ? f.summary[index[reveal.name]] : f.summary;
      figure.dataset.frame = spec.controls.map(c => index[c.name]).join("|");
      if (f.bytes !== undefined) figure.dataset.value = String(f.bytes);
    }

    spec.controls.forEach(c => {
      const id = figure.id + "-" + c.name;
      const wrap = document.createElement("div");
      wrap.className = "tc-fig-control";
      const label = document.createElement("label");
      label.htmlFor = id;
      label.textContent = c.label;
      wrap.appendChild(label);
      index[c.name] = c.initial;
      values[c.name] = c.values[c.initial];
      let input;
      const out = document.createElement("output");
      out.htmlFor = id;
      if (c.kind === "select") {
        input = document.createElement("select");
        c.labels.forEach((l, i) => {
          const o = document.createElement("option");
          o.value = String(i);
          o.textContent = l;
          input.appendChild(o);
        });
        input.value = String(c.initial);
      } else {
        input = document.createElement("input");
        input.type = "range";
        input.min = "0";
        input.max = String(c.values.length - 1);
        input.step = "1";
        input.value = String(c.initial);
        input.setAttribute("aria-valuetext", c.labels[c.initial]);
        out.textContent = c.labels[c.initial];
      }
      input.id = id;
      input.dataset.control = c.name;
      input.addEventListener("input", () => {
        const i = Number(input.value);
        index[c.name] = i;
        values[c.name] = c.values[i];
        if (c.kind !== "select") {
          out.textContent = c.labels[i];
          input.setAttribute("aria-valuetext", c.labels[i]);
        }
        render();
      });
      wrap.appendChild(input);
      if (c.kind !== "select") wrap.appendChild(out);
      controls.appendChild(wrap);
    });
    live.append(controls, panels, summary);
    live.hidden = false;
    figure.classList.add("tc-fig--live");
    render();
  }

  function start() {
    document.querySelectorAll("figure[data-tc-figure]").forEach(build);
  }
  window.courseFigures = { compute: compute };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
