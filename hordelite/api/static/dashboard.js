// hordelite dashboard: refreshes the server-rendered tables from the
// dashboard's read routes, draws the activity charts, and runs the chat playground
// through /v1/chat/completions. Every value from the horde (names, models,
// replies) is set as textContent, never parsed as markup.
"use strict";

(function () {
  const KEY_STORE = "hordelite.dashboard.apiKey";
  const REFRESH_MS = 10000;
  const SVG = "http://www.w3.org/2000/svg";

  function $(id) { return document.getElementById(id); }

  function cell(text, className) {
    const td = document.createElement("td");
    td.textContent = String(text);
    if (className) td.className = className;
    return td;
  }

  // Each cell carries its column's heading, which a phone's width shows
  // beside the value (the rows become cards there).
  function labelled(table, tr) {
    const headings = Array.from(table.tHead.rows[0].cells, function (th) { return th.textContent; });
    Array.from(tr.cells).forEach(function (td, i) { td.dataset.label = headings[i]; });
    return tr;
  }

  function emptyRow(columns, text) {
    const tr = document.createElement("tr");
    tr.className = "empty";
    const td = cell(text);
    td.colSpan = columns;
    tr.append(td);
    return tr;
  }

  async function getJSON(path) {
    const response = await fetch(path, { credentials: "omit", cache: "no-store" });
    if (!response.ok) throw new Error(path + ": " + response.status);
    return response.json();
  }

  // A last row saying how many more the horde holds than the page lists.
  function moreRow(columns, more, what) {
    const tr = document.createElement("tr");
    tr.className = "more";
    const td = cell("and " + more + " more " + what);
    td.colSpan = columns;
    tr.append(td);
    return tr;
  }

  // A listing's table: a row of each item's cells, the empty row when there
  // is none, and the "more" row when the horde holds more than the page.
  function fillTable(table, items, cellsOf, empty, more, what) {
    const columns = table.tHead.rows[0].cells.length;
    const rows = items.map(function (item) {
      const tr = document.createElement("tr");
      tr.append(...cellsOf(item));
      return labelled(table, tr);
    });
    if (!rows.length) rows.push(emptyRow(columns, empty));
    if (more) rows.push(moreRow(columns, more, what));
    table.tBodies[0].replaceChildren(...rows);
  }

  function renderModels(pool) {
    fillTable($("models"), pool.models, function (m) {
      const features = m.chat_features === null ? "—" : (m.chat_features.join(", ") || "chat");
      return [
        cell(m.name, "name"), cell(m.workers), cell(m.threads), cell(m.jobs),
        cell(m.queued), cell(m.eta + " s"), cell(m.performance + " t/s"), cell(features)];
    }, "No model is served now: start a worker.",
    pool.more_models, "models (fewer threads): see /api/v2/status/models?type=text");
  }

  function renderWorkers(pool) {
    fillTable($("workers"), pool.workers, function (w) {
      const models = w.models.join(", ") + (w.more_models ? " and " + w.more_models + " more" : "");
      return [
        cell(w.name, "name"), cell(models), cell(w.performance), cell(w.threads),
        cell(w.jobs_done), cell(w.status, "status " + w.status)];
    }, "No worker has checked in.",
    pool.more_workers, "workers (fewer jobs done): see /api/v2/workers");
  }

  function renderModelChoice(pool) {
    const select = $("model");
    const chosen = select.value;
    const names = pool.chat_models;
    $("more-chat-models").textContent = pool.more_chat_models
      ? "and " + pool.more_chat_models + " more chat models, fewer workers serve: name one through /v1"
      : "";
    const current = Array.from(select.options).map(function (o) { return o.value; });
    if (names.join("\n") === current.join("\n")) return;
    select.replaceChildren(...names.map(function (name) { return new Option(name, name); }));
    if (names.includes(chosen)) select.value = chosen;
  }

  async function refreshPool() {
    if (document.hidden) return;  // a tab in the background reads nothing
    try {
      // One capped answer, rendered once for every open page (decision 0048).
      const pool = await getJSON("/dashboard/pool");
      renderModels(pool);
      renderWorkers(pool);
      renderModelChoice(pool);
      $("updated").textContent = "updated " + new Date().toLocaleTimeString();
    } catch (error) {
      $("updated").textContent = "refresh failed: " + error.message;
    }
  }

  function chart(svg, values) {
    const width = 300, height = 60;
    const max = Math.max(1, ...values.filter(function (v) { return v !== null; }));
    const step = values.length > 1 ? width / (values.length - 1) : width;
    const points = values.map(function (v, i) {
      const y = height - 2 - ((v || 0) / max) * (height - 4);
      return (i * step).toFixed(1) + "," + y.toFixed(1);
    });
    const base = document.createElementNS(SVG, "line");
    base.setAttribute("x1", "0"); base.setAttribute("x2", String(width));
    base.setAttribute("y1", String(height - 2)); base.setAttribute("y2", String(height - 2));
    const line = document.createElementNS(SVG, "polyline");
    line.setAttribute("points", points.join(" "));
    const title = document.createElementNS(SVG, "title");
    title.textContent = "peak " + max.toFixed(max < 10 ? 2 : 0);
    svg.replaceChildren(title, base, line);
  }

  async function refreshActivity() {
    if (document.hidden) return;
    try {
      const activity = await getJSON("/dashboard/activity");
      const buckets = activity.buckets;
      const jobs = buckets.map(function (b) { return b.jobs; });
      const latency = buckets.map(function (b) { return b.latency; });
      const total = jobs.reduce(function (a, b) { return a + b; }, 0);
      const tokens = buckets.reduce(function (a, b) { return a + b.tokens; }, 0);
      const timed = buckets.filter(function (b) { return b.latency !== null; });
      const mean = timed.length
        ? timed.reduce(function (a, b) { return a + b.latency * b.jobs; }, 0) / total : null;
      $("activity-summary").textContent =
        "Last hour: " + total + " jobs done, " +
        tokens + " tokens" + (mean === null ? "" : ", mean latency " + mean.toFixed(1) + " s");
      chart($("chart-jobs"), jobs);
      chart($("chart-latency"), latency);
    } catch (error) {
      $("activity-summary").textContent = "Activity unavailable: " + error.message;
    }
  }

  // The playground ---------------------------------------------------------

  const conversation = [];
  let running = null;

  function say(role, text) {
    const li = document.createElement("li");
    li.className = role;
    li.textContent = text;
    $("transcript").append(li);
    return li;
  }

  function headers() {
    const h = { "Content-Type": "application/json" };
    const key = $("key").value.trim();
    // Only ever sent here, to this origin's /v1; without one the front
    // serves the call as the anonymous user.
    if (key) h["Authorization"] = "Bearer " + key;
    return h;
  }

  async function errorMessage(response) {
    try {
      const body = await response.json();
      if (body && body.error && body.error.message) return body.error.message;
    } catch (ignored) { /* not JSON */ }
    return "HTTP " + response.status;
  }

  async function stream(response, li) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    let text = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      const lines = buffer.split("\n");
      buffer = lines.pop();
      for (const line of lines) {
        if (!line.startsWith("data: ")) continue;  // blank lines, keep-alive comments
        const data = line.slice(6);
        if (data === "[DONE]") return text;
        const event = JSON.parse(data);
        if (event.error) throw new Error(event.error.message || "the stream failed");
        const delta = event.choices && event.choices[0] && event.choices[0].delta;
        if (delta && typeof delta.content === "string" && delta.content) {
          text += delta.content;
          li.textContent = text;
        }
      }
    }
    return text;
  }

  async function send(event) {
    event.preventDefault();
    const message = $("message").value.trim();
    const model = $("model").value;
    $("chat-error").textContent = "";
    if (!model) { $("chat-error").textContent = "No chat model is served now."; return; }
    if (!message || running) return;
    conversation.push({ role: "user", content: message });
    say("user", message);
    $("message").value = "";
    const li = say("assistant streaming", "");
    li.dataset.state = "streaming";
    running = new AbortController();
    $("send").disabled = true;
    $("stop").disabled = false;
    try {
      const response = await fetch("/v1/chat/completions", {
        method: "POST",
        headers: headers(),
        credentials: "omit",
        body: JSON.stringify({ model: model, messages: conversation, stream: true }),
        signal: running.signal,
      });
      if (!response.ok) throw new Error(await errorMessage(response));
      const text = await stream(response, li);
      conversation.push({ role: "assistant", content: text });
      li.dataset.state = "done";
    } catch (error) {
      conversation.pop();  // the turn without a reply is not sent again
      li.dataset.state = "failed";
      $("chat-error").textContent = error.name === "AbortError" ? "Stopped." : error.message;
    } finally {
      li.classList.remove("streaming");
      running = null;
      $("send").disabled = false;
      $("stop").disabled = true;
    }
  }

  function setUpPlayground() {
    const key = $("key");
    // sessionStorage: the key lasts as long as this tab, not on disk for good.
    key.value = sessionStorage.getItem(KEY_STORE) || "";
    key.addEventListener("input", function () {
      if (key.value) sessionStorage.setItem(KEY_STORE, key.value);
      else sessionStorage.removeItem(KEY_STORE);
    });
    $("chat").addEventListener("submit", send);
    $("stop").addEventListener("click", function () { if (running) running.abort(); });
    $("clear").addEventListener("click", function () {
      if (running) running.abort();
      conversation.length = 0;
      $("transcript").replaceChildren();
      $("chat-error").textContent = "";
    });
    $("message").addEventListener("keydown", function (e) {
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) $("chat").requestSubmit();
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    setUpPlayground();
    refreshActivity();
    $("refresh").addEventListener("click", function () {
      Promise.all([refreshPool(), refreshActivity()]).then(function () {
        document.body.dataset.refreshed = String(Number(document.body.dataset.refreshed || 0) + 1);
      });
    });
    setInterval(refreshPool, REFRESH_MS);
    setInterval(refreshActivity, 3 * REFRESH_MS);
    document.body.dataset.ready = "true";
  });
})();
