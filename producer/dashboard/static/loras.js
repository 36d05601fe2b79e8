// The LoRA adapters registered per base model: list, register, unregister.
import { api } from "./api.js";

export class Loras {
  constructor(doc, { onError, onAction }) {
    this.$ = (id) => doc.getElementById(id);
    this.onError = onError;
    this.onAction = onAction;
    this.canAct = false;
    this.$("lora-form").onsubmit = (event) => { event.preventDefault(); this.register(); };
  }

  async load(canAct) {
    this.canAct = canAct;
    try { this.render(await api("loras")); } catch (e) { this.onError(e); }
  }

  render(adapters) {
    const body = this.$("loras").tBodies[0];
    body.replaceChildren(...adapters.map((a) => this.row(a)));
  }

  row(adapter) {
    const tr = document.createElement("tr");
    const when = new Date(adapter.registered_ms).toLocaleString();
    const rank = adapter.rank || "?";  // 0: registered before ranks were kept
    for (const value of [adapter.model, adapter.name, adapter.path, rank, when]) {
      const td = document.createElement("td");
      td.textContent = value;
      tr.append(td);
    }
    const remove = document.createElement("button");
    remove.textContent = "Remove";
    remove.className = "danger act";
    remove.disabled = !this.canAct;
    remove.onclick = () => this.remove(adapter);
    const cell = document.createElement("td");
    cell.append(remove);
    tr.append(cell);
    return tr;
  }

  async register() {
    const json = {
      model: this.$("lora-model").value.trim(),
      name: this.$("lora-name").value.trim(),
      path: this.$("lora-path").value.trim(),
    };
    const rank = this.$("lora-rank").value.trim();
    if (rank) json.rank = Number(rank);
    try {
      await api("loras", { method: "POST", json });
      this.onAction(`${json.model}: adapter ${json.name} registered`);
      await this.load(this.canAct);
    } catch (e) { this.onError(e); }
  }

  async remove(adapter) {
    if (!window.confirm(`Unregister adapter ${adapter.name} of ${adapter.model}?`)) return;
    const query = `?model=${encodeURIComponent(adapter.model)}`;
    try {
      await api(`loras/${encodeURIComponent(adapter.name)}${query}`, { method: "DELETE" });
      this.onAction(`${adapter.model}: adapter ${adapter.name} removed`);
      await this.load(this.canAct);
    } catch (e) { this.onError(e); }
  }
}
