// Calls to the dashboard's API with the admin token, and server-sent events read with
// fetch (EventSource cannot send an Authorization header).
const TOKEN_KEY = "tokenq-admin-token";
const base = new URL("api/", window.location.href);

export class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

export function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }
export function setToken(value) {
  if (value) sessionStorage.setItem(TOKEN_KEY, value); else sessionStorage.removeItem(TOKEN_KEY);
}

function headers() {
  const t = token();
  return t ? { Authorization: `Bearer ${t}` } : {};
}

async function errorOf(response) {
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    message = body?.error?.message || body?.detail || message;
  } catch { /* not JSON: keep the status line */ }
  return new ApiError(response.status, message);
}

export async function api(path, { method = "GET", json } = {}) {
  const init = { method, headers: headers() };
  if (json !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(json);
  }
  const response = await fetch(new URL(path, base), init);
  if (!response.ok) throw await errorOf(response);
  return response.json();
}

// Reads an SSE response; calls onEvent(type, data, id) per message. Resolves when the
// server ends the stream, rejects on an HTTP error or a network failure.
export async function readEvents(path, onEvent, signal) {
  const response = await fetch(new URL(path, base), { headers: headers(), signal });
  if (!response.ok) throw await errorOf(response);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      dispatch(buffer.slice(0, end), onEvent);
      buffer = buffer.slice(end + 2);
    }
  }
}

function dispatch(block, onEvent) {
  let type = "message", id = null;
  const data = [];
  for (const line of block.split("\n")) {
    if (line.startsWith("event: ")) type = line.slice(7);
    else if (line.startsWith("id: ")) id = line.slice(4);
    else if (line.startsWith("data: ")) data.push(line.slice(6));
  }
  if (data.length) onEvent(type, JSON.parse(data.join("\n")), id);
}
