// raccel's web console: the scheduler's JSON API (the documents `raccelctl --json`
// prints) rendered live, its event stream, and the operator actions (with the bearer
// token). Plain JavaScript, no dependencies; every text from the API goes in through
// textContent.
"use strict";

const state = { token: sessionStorage.getItem("raccel-token") || "", pool: null, refreshTimer: null };

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

// Sizes as raccelctl prints them (common/error.h formatBytes): the largest binary unit the
// size reaches, whole when exact, else one decimal ("768 KiB", "1.5 GiB", "512 B").
function size(bytes) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
  let unit = 0;
  while (unit + 1 < units.length && bytes >= Math.pow(1024, unit + 1)) unit++;
  const scaled = bytes / Math.pow(1024, unit);
  return (Number.isInteger(scaled) ? String(scaled) : scaled.toFixed(1)) + " " + units[unit];
}
// TFLOPS to at most two decimals (8, 0.25, 0.01), never a float's 17 digits.
function tflops(t) { return String(Math.round(t * 100) / 100); }
// A node's host: what vaccels hold of its CPU and memory, and what it has ("-": not counted).
function hostUse(n) {
  const cpu = n.hostCpuMilli ? (n.hostCpuMilliUsed / 1000).toFixed(1) + " / " + (n.hostCpuMilli / 1000).toFixed(1) + " CPU" : "";
  const mem = n.hostMemoryMib ? size(n.hostMemoryMibUsed * 1048576) + " / " + size(n.hostMemoryMib * 1048576) : "";
  return [cpu, mem].filter(s => s).join(", ") || "-";
}

function ranges(list) {
  return list.map(b => (b.count > 1 ? b.first + "-" + (b.first + b.count - 1) : String(b.first))).join(",");
}

// A color per owner, the same on every page load: a hue from the owner's text.
function ownerColor(owner) {
  let h = 2166136261;
  for (let i = 0; i < owner.length; i++) h = Math.imul(h ^ owner.charCodeAt(i), 16777619);
  const hue = ((h >>> 0) % 360);
  return "hsl(" + hue + ", 65%, 52%)";
}

async function getJson(path) {
  const r = await fetch(path, { cache: "no-store" });
  if (!r.ok) throw new Error(path + ": HTTP " + r.status);
  return r.json();
}

function fillTable(id, rows) {
  const body = document.querySelector("#" + id + " tbody");
  body.replaceChildren(...rows);
}

function renderMap(pool) {
  const map = document.getElementById("blockmap");
  const legend = document.getElementById("legend");
  const owners = new Map();
  // Node -> kind -> cells, in block order.
  const nodes = new Map();
  for (const r of pool.ranges) {
    if (!nodes.has(r.node)) nodes.set(r.node, new Map());
    const kinds = nodes.get(r.node);
    if (!kinds.has(r.kind)) kinds.set(r.kind, []);
    for (let b = r.first; b <= r.last; b++) {
      const cell = el("div", { class: "block " + r.state, title: "block " + b + " · " + r.node + " · " + r.kind +
                                 (r.owner ? " · " + r.owner : " · " + r.state),
                               "data-block": String(b), "data-owner": r.owner, "data-state": r.state, "data-node": r.node },
                      String(b));
      if (r.state === "used") {
        cell.style.backgroundColor = ownerColor(r.owner);
        owners.set(r.owner, (owners.get(r.owner) || 0) + 1);
      }
      kinds.get(r.kind).push(cell);
    }
  }
  const groups = [];
  for (const [node, kinds] of nodes) {
    const regions = [];
    for (const [kind, cells] of kinds)
      regions.push(el("div", { class: "region" }, el("div", { class: "region-name" }, kind + " · " + cells.length), el("div", { class: "cells" }, ...cells)));
    groups.push(el("div", { class: "node-group", "data-node": node }, el("div", { class: "node-name" }, node), ...regions));
  }
  map.replaceChildren(...groups);
  const items = [];
  for (const [owner, count] of owners) {
    const swatch = el("span", { class: "swatch" });
    swatch.style.backgroundColor = ownerColor(owner);
    items.push(el("span", { class: "legend-item" }, swatch, owner + " (" + count + ")"));
  }
  items.push(el("span", { class: "legend-item" }, el("span", { class: "swatch free" }), "free"));
  items.push(el("span", { class: "legend-item" }, el("span", { class: "swatch draining" }), "draining"));
  items.push(el("span", { class: "legend-item" }, el("span", { class: "swatch offline" }), "offline"));
  legend.replaceChildren(...items);
  document.getElementById("map-caption").textContent = "· " + pool.summary;
}

function actionButton(label, action, args, undo) {
  const b = el("button", { type: "button", class: "small", "data-action": action }, label);
  b.addEventListener("click", () => act(action, args, undo));
  return b;
}

function render(data) {
  const { pool, nodes, cards, vaccels, vms } = data;
  renderMap(pool);
  document.getElementById("summary").textContent = nodes.nodes.length + " node(s), " + cards.cards.length + " card(s), " +
    pool.used + " of " + pool.blocks + " blocks held by " + vaccels.vaccels.length + " vaccel(s)";
  // In a shared pool, other schedulers' vaccels are listed too ("elsewhere"): their
  // actions belong to their own host's console.
  fillTable("vaccels", vaccels.vaccels.map(v => el("tr", { "data-id": v.host ? v.host + "#" + v.id : String(v.id) },
    el("td", {}, (v.host ? v.host + " " : "") + "#" + v.id), el("td", {}, v.vm), el("td", {}, v.program), el("td", {}, v.priority),
    el("td", {}, ranges(v.blocks) || "-"),
    el("td", {}, v.cards.map(c => c.node + "/" + c.index + ":" + c.kind + "×" + c.blocks).join(", ") || "-"),
    el("td", {}, size(v.memoryUsed) + " / " + size(v.memoryQuota)), el("td", {}, v.instructions),
    el("td", {}, Math.round(v.kernelMs) + " ms"), el("td", { class: "state-" + v.state }, v.state),
    el("td", {}, v.host ? "on " + v.host
                 : v.state === "suspended" ? actionButton("Resume", "resume", [String(v.id)])
                                           : actionButton("Preempt", "preempt", [String(v.id)])))));
  fillTable("nodes", nodes.nodes.map(n => el("tr", { "data-node": n.name },
    el("td", {}, n.name), el("td", { class: "state-" + n.state }, n.state),
    el("td", {}, n.address || "-"), el("td", {}, n.blocks ? n.firstBlock + "-" + (n.firstBlock + n.blocks - 1) : "-"),
    el("td", {}, n.contexts), el("td", {}, hostUse(n)), el("td", {}, n.online ? n.msSinceHeartbeat + " ms ago" : "-"),
    el("td", {}, n.state === "online" ? actionButton("Drain", "drain", [n.name])
                 : n.state === "draining" ? actionButton("Undrain", "drain", [n.name], true) : ""))));
  fillTable("cards", cards.cards.map(c => el("tr", {},
    el("td", {}, c.node), el("td", {}, c.index), el("td", {}, c.kind), el("td", {}, c.model), el("td", {}, c.backend),
    el("td", {}, tflops(c.tflops)), el("td", {}, size(c.memoryBytes)),
    el("td", {}, c.blocks ? c.firstBlock + "-" + (c.firstBlock + c.blocks - 1) : "-"))));
  fillTable("vms", vms.vms.map(v => el("tr", { title: v.problem || "" },
    el("td", {}, v.host ? v.name + " (on " + v.host + ")" : v.name), el("td", { class: "state-" + v.state }, v.state),
    el("td", {}, tflops(v.tflops)), el("td", {}, v.priority),
    el("td", {}, v.kinds), el("td", {}, size(v.memoryQuota)),
    el("td", {}, v.hostCpuMilli ? (v.hostCpuMilli / 1000).toFixed(1) : "-"),
    el("td", {}, v.hostMemoryMib ? size(v.hostMemoryMib * 1048576) : "-"), el("td", {}, v.blocksHeld), el("td", {}, v.source))));
  const select = document.getElementById("policy-vm");
  const chosen = select.value;
  // A VM of any host: set-policy reaches the hosts that serve it.
  select.replaceChildren(...[...new Set(vms.vms.map(v => v.name))].map(name => el("option", { value: name }, name)));
  if (chosen) select.value = chosen;
}

async function refresh() {
  try {
    const [pool, nodes, cards, vaccels, vms] = await Promise.all(
      ["pool", "nodes", "cards", "vaccels", "vms"].map(q => getJson("/api/" + q)));
    render({ pool, nodes, cards, vaccels, vms });
    document.body.dataset.loaded = "true";
  } catch (e) {
    document.getElementById("summary").textContent = "cannot reach the scheduler: " + e.message;
  }
}

function refreshSoon() {
  clearTimeout(state.refreshTimer);
  state.refreshTimer = setTimeout(refresh, 150);
}

function showEvent(e) {
  const when = new Date(e.unixMs).toLocaleTimeString();
  const item = el("li", { class: "event kind-" + e.kind, "data-kind": e.kind, "data-subject": e.subject },
    el("span", { class: "when" }, when), el("span", { class: "kind" }, e.kind), el("span", { class: "subject" }, e.subject),
    el("span", { class: "detail" }, e.detail));
  const list = document.getElementById("events");
  list.prepend(item);
  while (list.children.length > 300) list.lastChild.remove();
}

function followEvents() {
  const live = document.getElementById("live");
  const source = new EventSource("/api/events");
  source.onopen = () => { live.textContent = "events: live"; live.className = "badge on"; };
  source.onerror = () => { live.textContent = "events: reconnecting"; live.className = "badge off"; };
  source.onmessage = m => {
    try { showEvent(JSON.parse(m.data)); } catch (e) { return; }
    refreshSoon();
  };
}

function showResult(ok, text) {
  const out = document.getElementById("action-result");
  out.textContent = text;
  out.className = "result " + (ok ? "ok" : "refused");
}

async function act(action, args, undo) {
  const body = { action, args: args || [] };
  if (undo) body.undo = true;
  const headers = { "Content-Type": "application/json" };
  if (state.token) headers.Authorization = "Bearer " + state.token;
  try {
    const r = await fetch("/api/actions", { method: "POST", headers, body: JSON.stringify(body) });
    const reply = await r.json();
    if (r.ok) showResult(true, action + ": " + reply.done);
    else showResult(false, action + " refused (HTTP " + r.status + "): " + (reply.error ? reply.error.message : r.statusText));
  } catch (e) {
    showResult(false, action + " failed: " + e.message);
  }
  refreshSoon();
}

async function checkToken() {
  const headers = state.token ? { Authorization: "Bearer " + state.token } : {};
  const auth = document.getElementById("auth");
  try {
    const r = await (await fetch("/api/auth", { headers })).json();
    auth.textContent = r.actions === "disabled" ? "actions disabled (read-only scheduler)"
                     : r.authorized ? "token accepted" : state.token ? "token refused" : "read-only: no token";
    auth.dataset.authorized = String(r.authorized);
  } catch (e) {
    auth.textContent = "";
  }
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("token").value = state.token;
  document.getElementById("token-form").addEventListener("submit", ev => {
    ev.preventDefault();
    state.token = document.getElementById("token").value.trim();
    if (state.token) sessionStorage.setItem("raccel-token", state.token);
    else sessionStorage.removeItem("raccel-token");
    checkToken();
  });
  document.getElementById("defrag").addEventListener("click", () => act("defrag", []));
  document.getElementById("policy-form").addEventListener("submit", ev => {
    ev.preventDefault();
    const vm = document.getElementById("policy-vm").value;
    const settings = document.getElementById("policy-settings").value.split(/\s+/).filter(Boolean);
    act("set-policy", [vm, ...settings]);
  });
  checkToken();
  refresh();
  followEvents();
  setInterval(refresh, 5000);
});
