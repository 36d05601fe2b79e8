// Small helpers to build table cells from data without ever parsing it as HTML.
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "class") node.className = value;
    else if (key.startsWith("data-")) node.setAttribute(key, value);
    else node[key] = value;
  }
  for (const child of children) node.append(child instanceof Node ? child : String(child ?? ""));
  return node;
}

export function seconds(value) {
  if (value == null) return "–";
  if (value < 1) return `${Math.round(value * 1000)} ms`;
  if (value < 120) return `${value.toFixed(1)} s`;
  if (value < 7200) return `${Math.round(value / 60)} min`;
  return `${(value / 3600).toFixed(1)} h`;
}

export function ago(ms, nowMs) { return ms == null ? "–" : `${seconds((nowMs - ms) / 1000)} ago`; }
export function num(value, digits = 1) { return value == null ? "–" : value.toFixed(digits); }
export function percent(value) { return value == null ? "–" : `${Math.round(value * 100)}%`; }

export function bar(fraction, label) {
  const fill = el("span");
  fill.style.width = `${Math.round(Math.min(1, fraction || 0) * 100)}%`;
  return el("span", {}, el("span", { class: "bar" }, fill), label);
}

export function fill(tbody, rows, columns, empty) {
  tbody.replaceChildren(...(rows.length ? rows : [emptyRow(columns, empty)]));
}

function emptyRow(columns, text) {
  return el("tr", {}, el("td", { colSpan: columns, class: "empty" }, text));
}
