// The approval console's page: a live list of pending permission requests, answered with the
// agent's own options. Everything is built with textContent (never innerHTML): what agents
// send is shown, never run. Served with a Content-Security-Policy that forbids inline script.
"use strict";

const csrf = document.querySelector('meta[name="csrf-token"]').content;
// A session page follows one session (its meta tag); the console's page, all of them.
const followed = (document.querySelector('meta[name="console-session"]') || {}).content || "";
const cards = new Map(); // request id -> {el, deadline (ms, this clock), settled}
const SETTLED_KEPT_MS = 10 * 60 * 1000;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value !== null && value !== undefined) node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child !== null && child !== undefined) {
      node.append(typeof child === "string" ? document.createTextNode(child) : child);
    }
  }
  return node;
}

function who(settled) {
  if (settled.by === "console") return "the console";
  if (settled.by === "client") return "client " + (settled.connection || "");
  if (settled.by === "timeout") return "the deadline (no answer in time)";
  return settled.by;
}

function setStatus(state, text) {
  const status = document.getElementById("status");
  status.dataset.state = state;
  status.textContent = text;
}

function diffBlock(diff) {
  const pre = el("pre", { class: "diff" });
  const classes = { "+": "add", "-": "del", " ": "ctx", "@": "hunk" };
  for (const [op, text] of diff.lines) {
    pre.append(el("span", { class: classes[op] || "ctx" }, (op === "@" ? "" : op) + text));
  }
  if (diff.truncated) pre.append(el("span", { class: "hunk" }, "… (cut)"));
  return [el("div", { class: "diff-path" }, diff.path), pre];
}

function buildCard(request) {
  const session = request.session;
  const title = request.tool.title || "(untitled tool call)";
  const sessionText = [session.title, session.cwd ? "in " + session.cwd : null]
    .filter(Boolean).join(" · ");
  const card = el("article", { class: "request", "data-id": request.id, "data-state": "pending",
                                "aria-label": title },
    el("div", { class: "top" },
      el("h3", null, title),
      request.tool.kind ? el("span", { class: "kind" }, request.tool.kind) : null,
      el("span", { class: "left" })),
    el("div", { class: "meta" },
      "agent ", el("code", null, request.agent), " · session ", el("code", null, session.id),
      sessionText ? " · " + sessionText : "",
      el("span", { class: "shown" })),
  );
  if (request.locations.length) {
    const list = el("ul", { class: "locations" });
    for (const path of request.locations) list.append(el("li", null, el("code", null, path)));
    card.append(list);
  }
  for (const diff of request.diffs) card.append(...diffBlock(diff));
  if (request.command) card.append(el("pre", { class: "command" }, "$ " + request.command));
  card.append(el("div", { class: "note", hidden: "" }));
  const options = el("div", { class: "options" });
  for (const option of request.options) {
    const button = el("button", { type: "button", "data-option": option.optionId,
                                  "data-kind": option.kind || "" }, option.name);
    button.addEventListener("click", () => answer(request.id, option, button));
    options.append(button);
  }
  card.append(options, el("div", { class: "outcome", role: "status" }));
  return card;
}

function update(entry, request) {
  entry.deadline = Date.now() + request.timeLeftMs;
  const shown = entry.el.querySelector(".shown");
  if (request.shownTo === "console only") {
    shown.textContent = " · unattended: only the console can answer";
  } else {
    shown.textContent = request.shownTo ? " · also shown to " + request.shownTo : "";
  }
  const note = entry.el.querySelector(".note");
  note.hidden = !request.note;
  note.textContent = request.note || "";
}

function settle(id, text) {
  const entry = cards.get(id);
  if (!entry || entry.settled) return;
  entry.settled = Date.now();
  entry.el.dataset.state = "settled";
  for (const button of entry.el.querySelectorAll("button")) button.disabled = true;
  entry.el.querySelector(".left").textContent = "";
  entry.el.querySelector(".outcome").textContent = text;
}

function settledText(settled) {
  const what = settled.option ? settled.decision + ": " + settled.option : settled.decision;
  return "Settled by " + who(settled) + " (" + what + ")";
}

async function answer(id, option, button) {
  const entry = cards.get(id);
  if (!entry || entry.settled) return;
  for (const b of entry.el.querySelectorAll("button")) b.disabled = true;
  let response;
  try {
    response = await fetch("/console/answer", {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-Console-CSRF": csrf },
      body: JSON.stringify({ id: id, optionId: option.optionId }),
    });
  } catch (error) {
    entry.el.querySelector(".outcome").textContent = "Not sent: " + error;
    for (const b of entry.el.querySelectorAll("button")) b.disabled = false;
    return;
  }
  const body = await response.json().catch(() => ({}));
  if (response.ok) {
    settle(id, "");
    // (The live channel may have marked it settled first: this page's answer is what won.)
    entry.el.querySelector(".outcome").textContent = "Answered here: " + option.name;
  } else if (body.status === "already_settled") {
    settle(id, "Already settled by " + who(body) + " (" +
           (body.option ? body.decision + ": " + body.option : body.decision) + ")");
  } else if (body.status === "asked_again") {
    entry.el.querySelector(".outcome").textContent =
      "Not delivered: the file changed since it was asked. Look again, then answer.";
    for (const b of entry.el.querySelectorAll("button")) b.disabled = false;
  } else if (response.status === 404) {
    settle(id, "Already settled");
  } else {
    entry.el.querySelector(".outcome").textContent = "Refused (" + response.status + ")";
    for (const b of entry.el.querySelectorAll("button")) b.disabled = false;
  }
}

function render(snapshot) {
  const container = document.getElementById("requests");
  const pendingIds = new Set();
  for (const request of snapshot.pending) {
    pendingIds.add(request.id);
    let entry = cards.get(request.id);
    if (!entry) {
      entry = { el: buildCard(request), deadline: 0, settled: 0 };
      cards.set(request.id, entry);
      container.prepend(entry.el);
    }
    update(entry, request);
  }
  const settledById = new Map(snapshot.settled.map((s) => [s.id, s]));
  for (const [id, entry] of cards) {
    if (pendingIds.has(id)) continue;
    const settled = settledById.get(id);
    settle(id, settled ? settledText(settled) : "No longer pending");
    if (entry.settled && Date.now() - entry.settled > SETTLED_KEPT_MS) {
      entry.el.remove();
      cards.delete(id);
    }
  }
  document.getElementById("count").textContent = String(snapshot.pending.length);
  document.getElementById("empty").hidden = snapshot.pending.length > 0;
  if (snapshot.tree) renderTree(snapshot.tree);
  if (snapshot.items) renderLog(snapshot);
  else renderDecisions(snapshot.decisions);
  tick();
}

function renderDecisions(decisions) {
  const body = document.querySelector("#decisions tbody");
  body.replaceChildren(...decisions.map((d) => el("tr", null,
    el("td", null, new Date(d.time * 1000).toLocaleTimeString()),
    el("td", null, d.agent || ""),
    el("td", null, d.session || ""),
    el("td", null, d.title || ""),
    el("td", { class: d.decision }, d.decision),
    el("td", null, d.option || ""),
    el("td", null, d.connection ? d.source + " (" + d.connection + ")" : d.source))));
}

function sessionNode(session) {
  const owner = session.connection ? "owner " + session.connection : "no owner";
  const facts = [session.state, owner, session.watchers + " watching"];
  if (session.pending) facts.push(session.pending + " pending");
  if (session.orphan) facts.push("parent " + session.parent + " not listed");
  const item = el("li", { class: "session", "data-session": session.id,
                          "data-state": session.state || "" },
    el("a", { href: "/console/session?id=" + encodeURIComponent(session.id) },
       el("code", null, session.id)), " ", el("span", { class: "facts" }, facts.join(" · ")));
  if (session.children.length) {
    item.append(el("ul", { class: "children" }, ...session.children.map(sessionNode)));
  }
  return item;
}

function renderTree(tree) {
  const list = document.getElementById("tree");
  list.replaceChildren(...tree.agents.map((agent) => el("li", { class: "agent",
                                                                "data-agent": agent.name },
    el("strong", null, agent.name), " ", el("span", { class: "facts" }, agent.state || "gone"),
    agent.sessions.length ? el("ul", null, ...agent.sessions.map(sessionNode)) : null)));
  document.getElementById("session-count").textContent = String(tree.total);
  document.getElementById("tree-empty").hidden = tree.agents.length > 0;
  const omitted = document.getElementById("tree-omitted");
  omitted.hidden = !tree.omitted;
  omitted.textContent = tree.omitted ? "… and " + tree.omitted + " more sessions, not listed" +
    " (acp-bridge status lists them all)" : "";
}

function logItem(item) {
  if (item.kind === "tool") {
    const li = el("li", { class: "tool", "data-kind": "tool", "data-tool": item.id,
                          "data-status": item.status || "" },
      el("div", { class: "top" }, el("strong", null, item.title || "(tool call)"),
         item.toolKind ? el("span", { class: "kind" }, item.toolKind) : null,
         el("span", { class: "facts" }, item.status || "")));
    for (const diff of item.diffs) li.append(...diffBlock(diff));
    return li;
  }
  if (item.kind === "plan") {
    return el("li", { class: "plan", "data-kind": "plan" }, el("strong", null, "Plan"),
      el("ul", null, ...item.entries.map((e) => el("li", { "data-status": e.status || "" },
        "[" + (e.status || "?") + "] " + e.content))));
  }
  return el("li", { class: "message " + item.kind, "data-kind": item.kind },
    el("span", { class: "who" }, item.kind), el("div", { class: "text" }, item.text));
}

function renderLog(snapshot) {
  document.getElementById("log").replaceChildren(...snapshot.items.map(logItem));
  document.getElementById("log-cut").hidden = !snapshot.cut;
}

function tick() {
  const now = Date.now();
  for (const entry of cards.values()) {
    if (entry.settled) continue;
    const left = Math.max(0, Math.round((entry.deadline - now) / 1000));
    entry.el.querySelector(".left").textContent = "time left: " + left + " s";
  }
}

function connect() {
  const url = followed ? "/console/session/events?id=" + encodeURIComponent(followed)
                       : "/console/events";
  const events = new EventSource(url);
  events.onopen = () => setStatus("live", "live");
  events.onmessage = (message) => {
    const snapshot = JSON.parse(message.data);
    if (snapshot.type === "gone") {
      events.close();
      setStatus("denied", "session gone (ended, or not on this bridge)");
      return;
    }
    setStatus("live", "live");
    render(snapshot);
  };
  events.onerror = () => {
    if (events.readyState === EventSource.CLOSED) {
      setStatus("denied", "disconnected: log in again with the link serve printed");
    } else {
      setStatus("lost", "reconnecting…");
    }
  };
}

setInterval(tick, 1000);
connect();
