// The three charts over the last hour, drawn with uPlot from the history samples.
const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777",
  "#65a30d", "#475569", "#ea580c"];
const PRIORITY_NAMES = { 100: "critical", 75: "high", 50: "normal", 25: "low" };

const SERIES = {
  depth: (s) => Object.fromEntries(Object.entries(s.queues || {}).flatMap(([model, q]) =>
    Object.entries(q.p || {}).map(([p, n]) => [`${model} · ${PRIORITY_NAMES[p] || p}`, n]))),
  tps: (s) => Object.fromEntries(Object.entries(s.workers || {}).map(([id, w]) => [shortId(id), w.tps])),
  ttft: (s) => Object.fromEntries(Object.entries(s.ttft || {}).flatMap(([model, t]) =>
    ["p50", "p90", "p99"].map((q) => [`${model} ${q}`, t[q]]))),
};

function shortId(id) { return id.length > 14 ? `${id.slice(0, 6)}…${id.slice(-6)}` : id; }

export class Charts {
  constructor(root, windowS) {
    this.root = root;
    this.windowS = windowS;
    this.samples = [];
    this.plots = {};
  }

  setSamples(samples) { this.samples = samples; this.draw(); }

  add(sample) {
    if (this.samples.length && this.samples[this.samples.length - 1].t >= sample.t) return;
    this.samples.push(sample);
    const oldest = sample.t - this.windowS * 1000;
    while (this.samples.length && this.samples[0].t < oldest) this.samples.shift();
    this.draw();
  }

  draw() {
    for (const [name, pick] of Object.entries(SERIES)) this.drawOne(name, pick);
  }

  drawOne(name, pick) {
    const rows = this.samples.map(pick);
    const labels = [...new Set(rows.flatMap((r) => Object.keys(r)))].sort();
    const data = [this.samples.map((s) => s.t / 1000), ...labels.map((l) => rows.map((r) => r[l] ?? null))];
    const plot = this.plots[name];
    if (plot && plot.labels.join("\n") === labels.join("\n")) { plot.chart.setData(data); return; }
    plot?.chart.destroy();
    const target = this.root.querySelector(`#chart-${name}`);
    this.plots[name] = { labels, chart: new uPlot(options(labels, target), data, target) };
  }
}

function options(labels, target) {
  return {
    width: Math.max(360, target.clientWidth || 420), height: 200,
    series: [{}, ...labels.map((label, i) => ({ label, stroke: PALETTE[i % PALETTE.length], width: 1.5, spanGaps: false }))],
    axes: [{}, { size: 50 }],
    scales: { y: { range: (u, min, max) => [0, Math.max(1, max * 1.1)] } },
    legend: { live: false },
  };
}
