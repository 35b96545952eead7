// The Mosaic console: one page, no dependencies. Every element is built with textContent (never HTML
// from data), every change carries the session's CSRF token, and a 401 leads back to sign-in.

const PART_BYTES = 8 << 20;        // multipart part size for large files
const SINGLE_PUT_MAX = 16 << 20;   // larger files are sent in parts (the console API's body limit)
const PLOT_POINTS = 60;            // samples kept per plot (5 minutes at 5 s)
const PLOT_EVERY_MS = 5000;
const MAX_PLOTTED_DRIVES = 16;     // lines on the drive IO plot
const MAX_PLOTTED_OPS = 6;         // lines on the latency plot

let me = null;                     // { access_key, root, csrf }
let plotTimer = null;

// ---------- small helpers ----------

function h(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === false || v === null || v === undefined) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k === "class") e.className = v;
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function bytes(n) {
  if (n === null || n === undefined || isNaN(n)) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? n.toString() : n.toFixed(n < 10 ? 2 : 1)) + " " + units[i];
}

function when(s) {
  if (!s) return "—";
  const d = new Date(s);
  return isNaN(d) ? s : d.toLocaleString();
}

function say(text, info = false) {
  const m = document.getElementById("message");
  m.textContent = text;
  m.className = info ? "info" : "";
  m.hidden = !text;
}

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(method, call, { params = {}, json, body, headers = {} } = {}) {
  const q = new URLSearchParams(params).toString();
  const url = "/console/api/" + call + (q ? "?" + q : "");
  const h2 = { ...headers };
  if (method !== "GET" && me) h2["x-mosaic-csrf"] = me.csrf;
  if (json !== undefined) { h2["content-type"] = "application/json"; body = JSON.stringify(json); }
  const r = await fetch(url, { method, headers: h2, body, credentials: "same-origin" });
  let v = null;
  try { v = await r.json(); } catch (_) { v = null; }
  if (r.status === 401 && call !== "login") {
    // Signed out meanwhile (expired, or the key was deleted): back to sign-in, with the reason.
    const was = me;
    me = null;
    if (was) { say(v?.error || "sign in again"); route(); }
    throw new ApiError(401, v?.error || "sign in again");
  }
  if (!r.ok && r.status !== 207) throw new ApiError(r.status, v?.error || ("HTTP " + r.status));
  return v;
}

// An upload call with progress (fetch cannot report upload progress).
function send(method, call, params, blob, onProgress) {
  return new Promise((resolve, reject) => {
    const x = new XMLHttpRequest();
    x.open(method, "/console/api/" + call + "?" + new URLSearchParams(params));
    x.setRequestHeader("x-mosaic-csrf", me.csrf);
    if (blob.type) x.setRequestHeader("content-type", blob.type);
    x.upload.onprogress = (e) => onProgress(e.loaded);
    x.onload = () => {
      let v = null;
      try { v = JSON.parse(x.responseText); } catch (_) { }
      if (x.status >= 200 && x.status < 300) resolve(v);
      else reject(new ApiError(x.status, v?.error || ("HTTP " + x.status)));
    };
    x.onerror = () => reject(new ApiError(0, "the upload broke off"));
    x.send(blob);
  });
}

// ---------- sign-in ----------

async function signIn(e) {
  e.preventDefault();
  const access_key = document.getElementById("access-key").value.trim();
  const secret_key = document.getElementById("secret-key").value;
  try {
    me = await api("POST", "login", { json: { access_key, secret_key } });
    document.getElementById("secret-key").value = "";
    say("");
    if (!location.hash || location.hash === "#/signin") location.hash = "#/buckets"; else route();
  } catch (err) {
    say(err.message);
  }
}

async function signOut() {
  try { await api("POST", "logout"); } catch (_) { }
  me = null;
  location.hash = "#/signin";
  route();
}

// ---------- pages ----------

function page(title, ...content) {
  const p = document.getElementById("page");
  p.replaceChildren(h("h1", { id: "title" }, title), ...content);
}

async function bucketsPage() {
  const v = await api("GET", "buckets");
  const name = h("input", { id: "new-bucket", placeholder: "new-bucket-name", required: true, "aria-label": "New bucket name" });
  const create = h("form", { id: "create-bucket", onsubmit: async (e) => {
    e.preventDefault();
    try { await api("POST", "bucket", { params: { bucket: name.value.trim() } }); say("Bucket " + name.value.trim() + " created", true); render(); }
    catch (err) { say(err.message); }
  } }, h("label", {}, "Bucket name", name), h("button", { type: "submit" }, "Create bucket"));
  const usage = [];
  const rows = v.buckets.map((b) => h("tr", { "data-bucket": b.name },
    h("td", {}, h("a", { href: "#/objects/" + encodeURIComponent(b.name) + "/" }, b.name)),
    usageCell(usage, b.name, "objects"), usageCell(usage, b.name, "bytes"),
    h("td", { class: "wide" }, when(b.created)),
    h("td", {}, h("button", { class: "danger", type: "button", "aria-label": "Delete bucket " + b.name, onclick: async () => {
      if (!confirm("Delete bucket " + b.name + "?")) return;
      try { await api("DELETE", "bucket", { params: { bucket: b.name } }); say("Bucket " + b.name + " deleted", true); render(); }
      catch (err) { say("Bucket " + b.name + " was not deleted: " + err.message); }
    } }, "Delete"))));
  page("Buckets", create,
    rows.length ? h("table", { id: "buckets" }, h("thead", {}, h("tr", {}, h("th", {}, "Name"), h("th", { class: "num" }, "Objects"), h("th", { class: "num" }, "Size"), h("th", { class: "wide" }, "Created"), h("th", {}, ""))), h("tbody", {}, rows))
      : h("p", { class: "muted", id: "no-buckets" }, "No buckets yet."));
  // Counted after the page shows, one bucket at a time (each is a walk of its listing).
  for (const [name, cells] of Object.entries(groupBy(usage))) {
    try {
      const u = await api("GET", "usage", { params: { bucket: name } });
      const more = u.complete ? "" : "+";
      cells.objects.textContent = u.objects.toLocaleString() + more;
      cells.bytes.textContent = bytes(u.bytes) + more;
    } catch (err) {
      cells.objects.textContent = cells.bytes.textContent = "?";
      cells.objects.title = err.message;
    }
  }
}

function usageCell(usage, bucket, what) {
  const td = h("td", { class: "num usage-" + what }, "…");
  usage.push([bucket, what, td]);
  return td;
}

function groupBy(usage) {
  const out = {};
  for (const [bucket, what, td] of usage) (out[bucket] ||= {})[what] = td;
  return out;
}

function objectsPage(bucket, prefix) {
  const state = { token: null, rows: [] };
  const tbody = h("tbody");
  const more = h("button", { class: "plain", type: "button", hidden: true, id: "more" }, "More");
  const progress = h("progress", { id: "upload-progress", max: 1, value: 0, hidden: true });
  const status = h("span", { class: "muted", id: "upload-status" });
  const search = h("input", { id: "search", placeholder: "Search by prefix", "aria-label": "Search by prefix" });
  const files = h("input", { type: "file", multiple: true, id: "upload-files", "aria-label": "Upload files" });
  const folder = h("input", { type: "file", id: "upload-folder", "aria-label": "Upload a folder", webkitdirectory: true });

  const crumbs = h("div", { class: "crumbs" }, h("a", { href: "#/buckets" }, "Buckets"), " / ",
    h("a", { href: "#/objects/" + encodeURIComponent(bucket) + "/" }, bucket));
  let acc = "";
  for (const part of prefix.split("/").filter(Boolean)) {
    acc += part + "/";
    crumbs.append(" / ", h("a", { href: "#/objects/" + encodeURIComponent(bucket) + "/" + encodeURI(acc) }, part));
  }

  async function load(reset) {
    if (reset) { state.token = null; tbody.replaceChildren(); }
    const p = { bucket, prefix: prefix + search.value, max: 200 };
    if (state.token) p.token = state.token;
    const v = await api("GET", "objects", { params: p });
    for (const f of v.folders) {
      const name = f.slice(prefix.length);
      tbody.append(h("tr", { "data-folder": f }, h("td", {}), h("td", {}, h("a", { href: "#/objects/" + encodeURIComponent(bucket) + "/" + encodeURI(f) }, name)),
        h("td", { class: "num" }, "folder"), h("td", { class: "wide" }, ""), h("td", {})));
    }
    for (const o of v.objects) {
      const name = o.key.slice(prefix.length);
      tbody.append(h("tr", { "data-key": o.key },
        h("td", {}, h("input", { type: "checkbox", class: "pick", value: o.key, "aria-label": "Select " + name })),
        h("td", {}, h("span", { class: "mono" }, name)),
        h("td", { class: "num" }, bytes(o.size)),
        h("td", { class: "wide" }, when(o.modified)),
        h("td", {}, h("div", { class: "bar" },
          h("button", { class: "plain", type: "button", onclick: () => download(bucket, o.key) }, "Download"),
          h("button", { class: "plain", type: "button", onclick: () => share(bucket, o.key) }, "Share"),
          h("button", { class: "plain", type: "button", onclick: () => info(bucket, o.key) }, "Info"),
          h("button", { class: "danger", type: "button", onclick: () => remove(bucket, [o.key]) }, "Delete")))));
    }
    state.token = v.next;
    more.hidden = !v.next;
    if (!tbody.children.length) tbody.append(h("tr", {}, h("td", { colspan: 5, class: "muted" }, "Nothing here.")));
  }

  async function upload(list) {
    const total = list.reduce((n, f) => n + f.size, 0);
    let done = 0;
    progress.hidden = false; progress.max = Math.max(total, 1); progress.value = 0;
    try {
      for (const f of list) {
        const key = prefix + (f.webkitRelativePath || f.name);
        status.textContent = "Uploading " + key;
        await uploadOne(bucket, key, f, (n) => { progress.value = done + n; });
        done += f.size;
      }
      status.textContent = "Uploaded " + list.length + " file(s), " + bytes(total);
      say("Uploaded " + list.length + " file(s)", true);
      await load(true);
    } catch (err) {
      status.textContent = "";
      say("Upload failed: " + err.message);
    }
  }

  files.addEventListener("change", () => upload([...files.files]));
  folder.addEventListener("change", () => upload([...folder.files]));
  more.addEventListener("click", () => load(false).catch((e) => say(e.message)));
  const form = h("form", { id: "search-form", onsubmit: (e) => { e.preventDefault(); load(true).catch((err) => say(err.message)); } },
    h("label", {}, "Search", search), h("button", { type: "submit", class: "plain" }, "Search"));
  const deleteSelected = h("button", { class: "danger", type: "button", id: "delete-selected", onclick: () => {
    const keys = [...document.querySelectorAll("input.pick:checked")].map((c) => c.value);
    if (keys.length) remove(bucket, keys); else say("Select objects to delete first");
  } }, "Delete selected");
  page("Objects", crumbs,
    h("div", { class: "bar" }, h("label", {}, "Upload files", files), h("label", {}, "Upload a folder", folder), progress, status),
    h("div", { class: "bar" }, form, deleteSelected),
    h("table", { id: "objects" }, h("thead", {}, h("tr", {}, h("th", {}, ""), h("th", {}, "Name"), h("th", { class: "num" }, "Size"), h("th", { class: "wide" }, "Modified"), h("th", {}, ""))), tbody),
    more);
  return load(true);
}

async function uploadOne(bucket, key, file, onProgress) {
  if (file.size <= SINGLE_PUT_MAX) {
    return send("PUT", "object", { bucket, key }, file, onProgress);
  }
  const { upload_id } = await api("POST", "upload", { params: { bucket, key } });
  const parts = [];
  try {
    for (let at = 0, n = 1; at < file.size; at += PART_BYTES, n++) {
      const blob = file.slice(at, Math.min(at + PART_BYTES, file.size));
      const v = await send("PUT", "upload", { bucket, key, upload_id, part: n }, blob, (sent) => onProgress(at + sent));
      parts.push({ part: n, etag: v.etag });
    }
    return await api("POST", "complete", { params: { bucket, key, upload_id }, json: { parts } });
  } catch (err) {
    await api("DELETE", "upload", { params: { bucket, key, upload_id } }).catch(() => { });
    throw err;
  }
}

async function download(bucket, key) {
  try {
    const v = await api("POST", "link", { params: { bucket, key, download: 1, expires_s: 300 } });
    location.assign(v.url);
  } catch (err) { say(err.message); }
}

async function share(bucket, key) {
  const hours = prompt("The link works for how many hours? (at most 168)", "24");
  if (hours === null) return;
  try {
    const v = await api("POST", "link", { params: { bucket, key, expires_s: Math.round(Number(hours) * 3600) } });
    const out = h("input", { readonly: true, value: v.url, id: "share-link", class: "mono", "aria-label": "Share link" });
    dialog("Share link for " + key, h("p", {}, "Anyone with this link can download the object for " + hours + " hour(s)."), out);
    out.select();
  } catch (err) { say(err.message); }
}

async function info(bucket, key) {
  try {
    const v = await api("GET", "object", { params: { bucket, key } });
    const rows = Object.entries(v.headers).map(([k, x]) => h("tr", {}, h("th", {}, k), h("td", { class: "mono" }, x)));
    const tags = v.tags.length ? v.tags.map((t) => h("tr", {}, h("th", {}, t.key), h("td", {}, t.value))) : [h("tr", {}, h("td", { class: "muted" }, "No tags"))];
    dialog(key, h("h2", {}, "Metadata and checksums"), h("table", { id: "object-info" }, h("tbody", {}, rows)), h("h2", {}, "Tags"), h("table", {}, h("tbody", {}, tags)));
  } catch (err) { say(err.message); }
}

async function remove(bucket, keys) {
  if (!confirm("Delete " + keys.length + " object(s)?")) return;
  try {
    const v = await api("POST", "delete", { params: { bucket }, json: { keys } });
    if (v.failed.length) say("Not deleted: " + v.failed.map((f) => f.key + " (" + f.error + ")").join(", "));
    else say("Deleted " + v.deleted + " object(s)", true);
    render();
  } catch (err) { say(err.message); }
}

function dialog(title, ...content) {
  const d = h("dialog", { id: "dialog" }, h("h2", {}, title), ...content,
    h("form", { method: "dialog" }, h("button", { type: "submit", class: "plain" }, "Close")));
  document.body.append(d);
  d.addEventListener("close", () => d.remove());
  d.showModal();
}

async function keysPage() {
  const v = await api("GET", "admin/keys");
  const rows = v.keys.map((k) => {
    const grants = Object.entries(k.grants).map(([b, g]) => h("li", {}, b + ": " + g + " ",
      h("button", { class: "plain", type: "button", onclick: () => change("admin/keys/" + encodeURIComponent(k.access_key) + "/deny/" + encodeURIComponent(b) + "/read-write", "Revoked " + b) }, "Revoke")));
    const bucket = h("input", { placeholder: "bucket", "aria-label": "Bucket to grant", class: "grant-bucket" });
    const level = h("select", { "aria-label": "Access", class: "grant-level" }, h("option", { value: "read" }, "read"), h("option", { value: "write" }, "write"), h("option", { value: "read-write" }, "read-write"));
    return h("tr", { "data-key": k.access_key },
      h("td", { class: "mono" }, k.access_key),
      h("td", {}, h("ul", {}, grants), h("form", { onsubmit: (e) => { e.preventDefault(); change("admin/keys/" + encodeURIComponent(k.access_key) + "/allow/" + encodeURIComponent(bucket.value.trim()) + "/" + level.value, "Granted " + bucket.value.trim()); } },
        bucket, level, h("button", { type: "submit", class: "plain" }, "Grant"))),
      h("td", {}, h("button", { class: "danger", type: "button", onclick: () => { if (confirm("Delete key " + k.access_key + "?")) change("admin/keys/" + encodeURIComponent(k.access_key), "Key deleted", "DELETE"); } }, "Delete")));
  });
  const create = h("button", { type: "button", id: "create-key", onclick: async () => {
    try {
      const k = await api("POST", "admin/keys");
      await render();
      dialog("New access key", h("p", {}, "Copy the secret now: it is not shown again."),
        h("p", {}, "Access key: ", h("code", { id: "new-access-key" }, k.access_key)),
        h("p", {}, "Secret key: ", h("code", { id: "new-secret-key" }, k.secret_key)));
    } catch (err) { say(err.message); }
  } }, "Create key");
  page("Access keys", h("div", { class: "bar" }, create),
    h("table", { id: "keys" }, h("thead", {}, h("tr", {}, h("th", {}, "Access key"), h("th", {}, "Grants"), h("th", {}, ""))), h("tbody", {}, rows)));
}

async function change(call, done, method = "POST") {
  try { await api(method, call); say(done, true); await render(); } catch (err) { say(err.message); }
}

async function drivesPage() {
  const v = await api("GET", "admin/drives");
  const drives = v.drives.map((d) => h("tr", {},
    h("td", {}, d.set + "." + d.slot), h("td", { class: "mono wide" }, d.path),
    h("td", { class: d.state === "online" ? "ok" : "bad" }, d.state + (d.problem ? " (" + d.problem + ")" : "")),
    h("td", { class: "num" }, bytes(d.used_bytes) + " of " + bytes(d.max_bytes)),
    h("td", { class: "num" }, d.checksum_errors ?? "—"),
    h("td", { class: "num wide" }, d.background_scrub ? d.background_scrub.passes_completed + " passes, " + d.background_scrub.damaged.length + " damaged" : "—")));
  const sets = v.sets.map((s) => h("tr", {},
    h("td", {}, s.set), h("td", {}, s.erasure), h("td", { class: s.ready ? "ok" : "bad" }, s.ready ? "ready" : "not ready"),
    h("td", { class: "num" }, s.heal_backlog), h("td", { class: "num" }, s.healed_objects + " (" + bytes(s.healed_bytes) + ")"),
    h("td", { class: "num wide" }, s.scans_completed), h("td", { class: "num wide" }, s.degraded_reads + " / " + s.partial_writes + " / " + s.failed_writes)));
  page("Drives",
    h("table", { id: "drives" }, h("thead", {}, h("tr", {}, h("th", {}, "Drive"), h("th", { class: "wide" }, "Path"), h("th", {}, "State"), h("th", { class: "num" }, "Used"), h("th", { class: "num" }, "Checksum errors"), h("th", { class: "num wide" }, "Scrub"))), h("tbody", {}, drives)),
    h("h2", {}, "Erasure sets"),
    h("table", { id: "sets" }, h("thead", {}, h("tr", {}, h("th", {}, "Set"), h("th", {}, "Code"), h("th", {}, "State"), h("th", { class: "num" }, "Heal backlog"), h("th", { class: "num" }, "Healed"), h("th", { class: "num wide" }, "Scans"), h("th", { class: "num wide" }, "Degraded reads / partial / failed writes"))), h("tbody", {}, sets)));
}

async function clusterPage() {
  let v;
  try { v = await api("GET", "admin/cluster"); } catch (err) {
    if (err.status === 409) { page("Cluster", h("p", { class: "muted", id: "no-cluster" }, err.message)); return; }
    throw err;
  }
  const nodes = (v.nodes || []).map((n) => h("tr", {}, h("td", { class: "mono" }, n.id), h("td", {}, n.address), h("td", { class: n.state === "up" ? "ok" : "bad" }, n.state), h("td", { class: "num" }, n.groups ?? "—")));
  const r = v.rebalance || {};
  page("Cluster",
    h("div", { class: "cards" },
      h("div", { class: "card" }, "Role: ", h("b", {}, v.role), h("br"), "Epoch ", v.epoch, ", erasure ", v.erasure),
      h("div", { class: "card" }, "Placement groups: ", v.groups_placed, " of ", v.placement_groups, h("br"), "Moving: ", v.groups_moving),
      h("div", { class: "card" }, "Rebalance: ", r.paused ? "paused" : "running", h("br"), "Moved ", r.groups_moved ?? 0, " groups, ", bytes(r.bytes_moved ?? 0), r.eta_s ? ", ETA " + r.eta_s + " s" : "")),
    h("table", { id: "nodes" }, h("thead", {}, h("tr", {}, h("th", {}, "Node"), h("th", {}, "Address"), h("th", {}, "State"), h("th", { class: "num" }, "Groups"))), h("tbody", {}, nodes)));
}

// Whether a microstore met its target in the last round (null: it served nothing then).
function targetMet(m) {
  const r = m.last_round;
  if (!r || !r.requests) return null;
  if (m.target.latency_ms_p99 !== undefined) return r.latency_ms_p99 !== null && r.latency_ms_p99 <= m.target.latency_ms_p99;
  return r.throughput_mib_s >= m.target.throughput_mib_s;
}

async function microstoresPage() {
  const v = await api("GET", "admin/microstores");
  const target = (t) => t.latency_ms_p99 !== undefined ? "p99 ≤ " + t.latency_ms_p99 + " ms" : "≥ " + t.throughput_mib_s + " MiB/s";
  const measured = (r) => !r || !r.requests ? "—" : (r.latency_ms_p99 === null ? "—" : r.latency_ms_p99.toFixed(1) + " ms p99") + ", " + r.throughput_mib_s.toFixed(1) + " MiB/s";
  const rows = v.microstores.map((m) => {
    const ok = targetMet(m);
    const met = ok === null ? h("span", { class: "muted" }, "no traffic") : ok ? h("span", { class: "ok" }, "met") : h("span", { class: "bad" }, "missed");
    return h("tr", { "data-microstore": m.name }, h("td", {}, m.name), h("td", {}, m.class ?? "any"), h("td", {}, target(m.target)),
      h("td", {}, met, " ", h("span", { class: "muted" }, measured(m.last_round))),
      h("td", { class: "num" }, m.workers + " (" + m.in_use + " busy, " + m.waiting + " waiting)"),
      h("td", { class: "num wide" }, m.bandwidth_cap_mib_s ? m.bandwidth_cap_mib_s.toFixed(0) + " MiB/s" : "—"),
      h("td", { class: "num wide" }, m.io_points === null ? "unshared" : m.io_points + " pts, " + bytes(m.io_served_bytes) + " served"),
      h("td", { class: "wide" }, m.assigned.join(", ")));
  });
  const buckets = v.buckets.map((b) => h("tr", {}, h("td", {}, b.bucket), h("td", {}, b.class ?? "—"),
    h("td", {}, b.microstore + (b.assigned ? " (by hand)" : "")),
    h("td", { class: "num" }, b.requests_per_s.toFixed(1)), h("td", { class: "num wide" }, bytes(b.bytes_per_s) + "/s")));
  page("Microstores",
    h("p", { class: "muted" }, v.free_workers + " workers free; resources move between microstores ", v.adapt ? "as load changes." : "only by hand (adapt is off)."),
    h("table", { id: "microstores" }, h("thead", {}, h("tr", {}, h("th", {}, "Name"), h("th", {}, "Class"), h("th", {}, "Target"), h("th", {}, "Last round"), h("th", { class: "num" }, "Workers"), h("th", { class: "num wide" }, "Bandwidth cap"), h("th", { class: "num wide" }, "IO share"), h("th", { class: "wide" }, "Assigned"))), h("tbody", {}, rows)),
    h("h2", {}, "Buckets"),
    h("table", { id: "microstore-buckets" }, h("thead", {}, h("tr", {}, h("th", {}, "Bucket"), h("th", {}, "Class"), h("th", {}, "Microstore"), h("th", { class: "num" }, "Requests/s"), h("th", { class: "num wide" }, "Bytes/s"))), h("tbody", {}, buckets)));
}

// ---------- metrics ----------

// Prometheus text: [{name, labels: {...}, value}]
function parseMetrics(text) {
  const out = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)/);
    if (!m) continue;
    const labels = {};
    for (const l of (m[3] || "").matchAll(/([a-zA-Z_]+)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2];
    out.push({ name: m[1], labels, value: Number(m[4]) });
  }
  return out;
}

function sum(ms, name, f = () => true) {
  return ms.filter((m) => m.name === name && f(m.labels)).reduce((a, m) => a + m.value, 0);
}

// The p99 (seconds) of an op from the change of its histogram buckets between two scrapes.
function p99(prev, cur, op) {
  const b = (ms) => ms.filter((m) => m.name === "mosaic_s3_request_duration_seconds_bucket" && m.labels.op === op);
  const before = new Map(b(prev).map((m) => [m.labels.le + m.labels.status, m.value]));
  const by = new Map();
  for (const m of b(cur)) {
    const le = m.labels.le === "+Inf" ? Infinity : Number(m.labels.le);
    by.set(le, (by.get(le) || 0) + m.value - (before.get(m.labels.le + m.labels.status) || 0));
  }
  const les = [...by.keys()].sort((a, c) => a - c);
  const total = by.get(Infinity) || 0;
  if (!total) return null;
  for (const le of les) if (by.get(le) >= 0.99 * total) return le === Infinity ? null : le;
  return null;
}

function plot(canvas, series, unit) {
  const c = canvas.getContext("2d");
  const w = canvas.width = canvas.clientWidth * devicePixelRatio;
  const hgt = canvas.height = canvas.clientHeight * devicePixelRatio;
  c.clearRect(0, 0, w, hgt);
  const max = Math.max(1e-9, ...series.flatMap((s) => s.points.filter((p) => p !== null)));
  const colors = ["#2456c7", "#c75a24", "#1e7b34", "#8a24c7", "#b3261e"];
  series.forEach((s, i) => {
    c.strokeStyle = c.fillStyle = colors[i % colors.length]; c.lineWidth = 2 * devicePixelRatio; c.beginPath();
    let drawing = false, last = null;
    s.points.forEach((p, j) => {
      if (p === null) { drawing = false; return; }
      // The samples so far fill the width; from PLOT_POINTS on, the oldest scroll out.
      const x = (j / Math.max(s.points.length - 1, 1)) * w, y = hgt - (p / max) * (hgt - 6) - 3;
      if (drawing) c.lineTo(x, y); else c.moveTo(x, y);
      drawing = true; last = [x, y];
    });
    c.stroke();
    if (last) { c.beginPath(); c.arc(last[0], last[1], 3 * devicePixelRatio, 0, 2 * Math.PI); c.fill(); }
  });
  canvas.dataset.points = series.length ? series[0].points.filter((p) => p !== null).length : 0;
  canvas.setAttribute("aria-label", series.map((s) => s.name + " " + (s.points.at(-1) ?? 0).toFixed(2) + " " + unit).join(", "));
}

async function metricsPage() {
  const charts = {
    rps: { title: "Requests/s", unit: "req/s" },
    s3: { title: "S3 MiB/s (in, out)", unit: "MiB/s" },
    io: { title: "Drive IO, MiB/s read + written, per drive", unit: "MiB/s" },
    p99: { title: "p99 latency, ms, per operation", unit: "ms" },
  };
  const cards = Object.entries(charts).map(([id, c]) => {
    c.canvas = h("canvas", { class: "plot", id: "plot-" + id, role: "img" });
    c.now = h("div", { class: "muted" });
    c.series = [];
    return h("div", { class: "card" }, h("b", {}, c.title), c.canvas, c.now);
  });
  page("Metrics", h("p", { class: "muted" }, "From this server's /metrics, every " + PLOT_EVERY_MS / 1000 + " seconds."), h("div", { class: "cards", id: "plots" }, cards));
  let prev = null, prevAt = 0;
  const push = (c, name, v) => {
    let s = c.series.find((x) => x.name === name);
    if (!s) {
      // A line that starts later starts at the same place in time as the others.
      const before = Math.max(0, ...c.series.map((x) => x.points.length - 1));
      s = { name, points: Array(before).fill(null) };
      c.series.push(s);
    }
    s.points.push(v);
    if (s.points.length > PLOT_POINTS) s.points.shift();
  };
  async function tick() {
    const r = await fetch("/metrics", { credentials: "same-origin" });
    const cur = parseMetrics(await r.text());
    const at = performance.now();
    if (prev) {
      const dt = (at - prevAt) / 1000;
      push(charts.rps, "all", (sum(cur, "mosaic_s3_requests_total") - sum(prev, "mosaic_s3_requests_total")) / dt);
      const mib = (n) => (sum(cur, n) - sum(prev, n)) / dt / 1048576;
      push(charts.s3, "in", mib("mosaic_s3_received_bytes_total"));
      push(charts.s3, "out", mib("mosaic_s3_sent_bytes_total"));
      const drives = [...new Set(cur.filter((m) => m.name === "mosaic_engine_device_bytes_read").map((m) => m.labels.drive))].slice(0, MAX_PLOTTED_DRIVES);
      for (const drive of drives) {
        const one = (l) => l.drive === drive;
        const moved = (ms) => sum(ms, "mosaic_engine_device_bytes_read", one) + sum(ms, "mosaic_engine_device_bytes_written", one);
        push(charts.io, "drive " + drive, (moved(cur) - moved(prev)) / dt / 1048576);
      }
      // Every operation seen so far gets a line (at most MAX_PLOTTED_OPS, the busiest first).
      const counts = new Map();
      for (const m of cur) if (m.name === "mosaic_s3_request_duration_seconds_count") counts.set(m.labels.op, (counts.get(m.labels.op) || 0) + m.value);
      const ops = [...counts.entries()].sort((a, b) => b[1] - a[1]).slice(0, MAX_PLOTTED_OPS).map(([op]) => op);
      for (const op of ops) {
        const v = p99(prev, cur, op);
        push(charts.p99, op, v === null ? null : v * 1000);
      }
      for (const c of Object.values(charts)) {
        plot(c.canvas, c.series, c.unit);
        c.now.textContent = c.series.map((s) => s.name + ": " + (s.points.at(-1) === null ? "—" : s.points.at(-1).toFixed(1))).join("  ");
      }
    }
    prev = cur; prevAt = at;
  }
  await tick();
  plotTimer = setInterval(() => tick().catch(() => { }), PLOT_EVERY_MS);
}

// ---------- routing ----------

async function render() {
  if (plotTimer) { clearInterval(plotTimer); plotTimer = null; }
  const [, pageName, ...rest] = (location.hash || "#/buckets").split("/");
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("current", a.dataset.page === pageName);
  try {
    switch (pageName) {
      case "objects": {
        const bucket = decodeURIComponent(rest[0] || "");
        return await objectsPage(bucket, decodeURI(rest.slice(1).join("/")));
      }
      case "keys": return await keysPage();
      case "drives": return await drivesPage();
      case "cluster": return await clusterPage();
      case "microstores": return await microstoresPage();
      case "metrics": return await metricsPage();
      default: return await bucketsPage();
    }
  } catch (err) {
    if (err.status !== 401) say(err.message);
  }
}

async function route() {
  if (!me) {
    try { me = await api("GET", "me"); } catch (_) { me = null; }
  }
  const signedIn = !!me;
  document.getElementById("signin").hidden = signedIn;
  document.getElementById("page").hidden = !signedIn;
  document.getElementById("nav").hidden = !signedIn;
  document.getElementById("signout").hidden = !signedIn;
  document.getElementById("who").textContent = signedIn ? me.access_key + (me.root ? " (root)" : "") : "";
  for (const a of document.querySelectorAll("nav a[data-root]")) a.hidden = !(me && me.root);
  if (!signedIn) { document.getElementById("access-key").focus(); return; }
  await render();
}

document.getElementById("signin-form").addEventListener("submit", signIn);
document.getElementById("signout").addEventListener("click", signOut);
window.addEventListener("hashchange", () => { say(""); route(); });
route();
