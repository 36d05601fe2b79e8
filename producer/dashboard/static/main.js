// Boot: the access check, the live overview, the charts and the operator's actions.
import { api, readEvents, setToken, token } from "./api.js";
import { Charts } from "./charts.js";
import { Detail } from "./detail.js";
import { Loras } from "./loras.js";
import { renderBatches, renderQueues, renderRequests, renderUsage, renderWorkers } from "./tables.js";

const $ = (id) => document.getElementById(id);
const state = { access: null, overview: null, kind: "running", live: null };
const charts = new Charts(document, 3600);
const detail = new Detail({ onError: showError, onAction: notice });
const loras = new Loras(document, { onError: showError, onAction: notice });

function showError(error) { banner(error.message || String(error), "error"); }
function notice(text) { banner(text, "info"); }
function banner(text, kind) {
  $("banner").textContent = text;
  $("banner").className = kind;
  $("banner").hidden = !text;
}

async function start() {
  const fromLink = new URLSearchParams(window.location.hash.slice(1)).get("token");
  if (fromLink) { setToken(fromLink); history.replaceState(null, "", window.location.pathname); }
  state.live?.abort();
  try {
    state.access = await api("access");
  } catch (e) {
    showSignIn(true);
    $("dashboard").hidden = true;
    return showError(e);
  }
  showAccess(state.access);
  if (!state.access.can_view) return;
  $("dashboard").hidden = false;
  charts.setSamples(await api("history?window_s=3600").catch(() => []));
  loras.load(state.access.can_act);
  followLive();
}

function showAccess(access) {
  const badge = $("access");
  badge.hidden = false;
  badge.textContent = access.can_act ? "operator" : access.can_view ? "read-only" : "signed out";
  badge.className = `pill ${access.can_act ? "ok" : "readonly"}`;
  showSignIn(!access.can_act);
  document.querySelectorAll("button.act").forEach((b) => { b.disabled = !access.can_act; });
  if (!access.can_view) banner("admin token required to view this dashboard: enter it above", "error");
  else if (!access.can_act) banner("Read-only view: actions (cancel, retry, purge, pause, drain) need the admin token", "info");
  else banner("", "info");
}

function showSignIn(visible) {
  $("token-form").hidden = !visible;
  $("sign-out").hidden = visible || !token();
}

async function followLive() {
  const controller = new AbortController();
  state.live = controller;
  while (!controller.signal.aborted) {
    try {
      setLive(true);
      await readEvents("live", onLive, controller.signal);
    } catch (e) {
      if (controller.signal.aborted) return;
      if (e.status) { showError(e); setLive(false); return; }
    }
    setLive(false);
    await new Promise((r) => setTimeout(r, 2000));
  }
}

function setLive(on) {
  $("live-state").textContent = on ? "live" : "reconnecting…";
  $("live-state").className = `pill ${on ? "ok" : "off"}`;
}

function onLive(type, data) {
  if (type === "overview") { state.overview = data; render(); }
  else if (type === "sample") charts.add(data);
}

function render() {
  const o = state.overview;
  const canAct = state.access.can_act;
  renderQueues($("queues").tBodies[0], o.queues, { canAct, onPause: pause });
  renderWorkers($("workers").tBodies[0], o.workers, o.t, { canAct, onDrain: drain });
  renderRequests($("requests").tBodies[0], o.lists[state.kind] || [], o.t, (id) => detail.open(id));
  renderBatches($("batches").tBodies[0], o.batches || [], o.t, { canAct, onCancel: cancelBatch });
  renderUsage($("usage").tBodies[0], o.usage || []);
  $("purge-dead").hidden = state.kind !== "dead";
}

async function act(path, message) {
  try { await api(path, { method: "POST" }); notice(message); } catch (e) { showError(e); }
}
const pause = (q, paused) => act(`queues/${q.tag}/${paused ? "pause" : "resume"}`,
  `${q.model}: ${paused ? "paused (workers stop claiming)" : "resumed"}`);
const cancelBatch = (b) => act(`batches/${encodeURIComponent(b.id)}/cancel`,
  `batch ${b.id}: cancelling (queued lines removed, running ones stop)`);
const drain = (w) => act(`workers/${encodeURIComponent(w.id)}/drain`, `worker ${w.id}: draining`);

$("purge-dead").onclick = async () => {
  if (!window.confirm("Delete every dead-lettered request and its stream?")) return;
  try { notice(`purged ${(await api("dead/purge", { method: "POST" })).purged} dead-lettered requests`); }
  catch (e) { showError(e); }
};
$("tabs").onclick = (event) => {
  const kind = event.target.dataset?.kind;
  if (!kind) return;
  state.kind = kind;
  document.querySelectorAll("#tabs button[data-kind]").forEach((b) => b.classList.toggle("active", b.dataset.kind === kind));
  if (state.overview) render();
};
$("find-form").onsubmit = (event) => { event.preventDefault(); detail.open($("find-id").value.trim()); };
$("token-form").onsubmit = (event) => { event.preventDefault(); setToken($("token").value.trim()); $("token").value = ""; start(); };
$("sign-out").onclick = () => { setToken(""); detail.close(); start(); };

start();
