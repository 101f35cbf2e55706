// countersign web inbox: live updates over server-sent events, time left, batch selection
// and keyboard shortcuts. Every HTML fragment comes from the server, already escaped.
"use strict";

(function () {
  function fragment(html) {
    const template = document.createElement("template");
    template.innerHTML = html;
    return template.content;
  }

  // Opens the page's event stream. The first connection resumes after the seq the page was
  // rendered at; the browser's own reconnects send Last-Event-ID.
  function follow(element, handlers) {
    const url = element.dataset.events + "&after=" + encodeURIComponent(element.dataset.seq);
    const source = new EventSource(url);
    Object.keys(handlers).forEach(function (name) {
      source.addEventListener(name, function (event) {
        element.dataset.seq = event.lastEventId;
        handlers[name](JSON.parse(event.data));
      });
    });
    source.addEventListener("open", function () { document.body.dataset.live = "open"; });
    source.addEventListener("error", function () { document.body.dataset.live = "reconnecting"; });
    return source;
  }

  // ---- inbox ----
  function rowOrder(a, b) {
    const risk = Number(b.dataset.riskRank) - Number(a.dataset.riskRank);
    if (risk !== 0) return risk;
    const age = Number(a.dataset.created) - Number(b.dataset.created);
    return age !== 0 ? age : (a.dataset.id < b.dataset.id ? -1 : 1);
  }

  function refreshCount() {
    const rows = document.querySelectorAll("#rows tr.row");
    const count = document.getElementById("count");
    if (count) count.textContent = "(" + rows.length + ")";
    const batch = document.getElementById("batch");
    if (batch) batch.classList.toggle("inbox-empty", rows.length === 0);
  }

  function upsertRow(data) {
    const tbody = document.getElementById("rows");
    const old = document.getElementById("row-" + data.id);
    const wasChecked = old && old.querySelector("input[type=checkbox]").checked;
    const wasSelected = old && old.classList.contains("selected");
    if (old) old.remove();
    if (!data.pending) { refreshCount(); return; }
    const row = fragment(data.html).querySelector("tr");
    if (wasChecked) row.querySelector("input[type=checkbox]").checked = true;
    if (wasSelected) row.classList.add("selected");
    const before = Array.from(tbody.querySelectorAll("tr.row")).find(function (other) {
      return rowOrder(row, other) < 0;
    });
    tbody.insertBefore(row, before || null);
    refreshCount();
    tick();
  }

  function resyncRows(data) {
    const tbody = document.getElementById("rows");
    const checked = new Set(Array.from(tbody.querySelectorAll("input:checked")).map(function (i) { return i.value; }));
    tbody.replaceChildren(fragment(data.html));
    tbody.querySelectorAll("input[type=checkbox]").forEach(function (input) {
      if (checked.has(input.value)) input.checked = true;
    });
    refreshCount();
    tick();
  }

  // ---- approval page ----
  function updateStatus(data) {
    const status = document.getElementById("status");
    status.replaceChildren(fragment(data.html));
    const form = document.getElementById("decide");
    if (form && !data.pending) form.hidden = true;
  }

  // ---- time left ----
  function left(ms) {
    if (ms <= 0) return "expired";
    const s = Math.floor(ms / 1000);
    if (s < 60) return s + "s";
    const m = Math.floor(s / 60);
    if (m < 60) return m + "m " + (s % 60) + "s";
    const h = Math.floor(m / 60);
    return h < 48 ? h + "h " + (m % 60) + "m" : Math.floor(h / 24) + "d";
  }

  function tick() {
    const now = Date.now();
    document.querySelectorAll("[data-expires]").forEach(function (cell) {
      const expires = Number(cell.dataset.expires);
      if (expires > 0) cell.textContent = left(expires - now);
    });
  }

  // ---- keyboard ----
  function rows() { return Array.from(document.querySelectorAll("#rows tr.row")); }

  function move(step) {
    const all = rows();
    if (all.length === 0) return;
    const current = all.findIndex(function (row) { return row.classList.contains("selected"); });
    const next = Math.max(0, Math.min(all.length - 1, current + step));
    all.forEach(function (row) { row.classList.remove("selected"); });
    all[next].classList.add("selected");
    all[next].scrollIntoView({ block: "nearest" });
  }

  function selected() { return document.querySelector("#rows tr.selected"); }

  function onKey(event) {
    const target = event.target;
    if (target && (target.tagName === "INPUT" || target.tagName === "TEXTAREA" || target.tagName === "SELECT")) {
      if (event.key === "Escape") target.blur();
      return;
    }
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    const help = document.getElementById("help");
    switch (event.key) {
      case "j": move(1); break;
      case "k": move(-1); break;
      case "o":
      case "Enter": {
        const row = selected();
        if (row) window.location.href = "/approvals/" + row.dataset.id;
        else return;
        break;
      }
      case "x": {
        const row = selected();
        if (!row) return;
        const box = row.querySelector("input[type=checkbox]");
        box.checked = !box.checked;
        break;
      }
      case "a": {
        const approve = document.getElementById("approve");
        if (approve && !document.getElementById("decide").hidden) approve.click();
        else if (selected()) window.location.href = "/approvals/" + selected().dataset.id;
        else return;
        break;
      }
      case "r": {
        const reason = document.getElementById("reason");
        const form = document.getElementById("decide");
        if (reason && form && !form.hidden) {
          form.dataset.rejecting = "yes";
          reason.focus();
        } else if (selected()) window.location.href = "/approvals/" + selected().dataset.id;
        else return;
        break;
      }
      case "?":
        if (help.open) help.close(); else help.showModal();
        break;
      default: return;
    }
    event.preventDefault();
  }

  document.addEventListener("DOMContentLoaded", function () {
    const inbox = document.getElementById("inbox");
    if (inbox) {
      follow(inbox, { row: upsertRow, resync: resyncRows });
      document.querySelectorAll(".select-agent").forEach(function (button) {
        button.addEventListener("click", function () {
          rows().forEach(function (row) {
            if (row.dataset.agent === button.dataset.agent) row.querySelector("input[type=checkbox]").checked = true;
          });
        });
      });
      refreshCount();
    }
    const approval = document.getElementById("approval");
    if (approval) follow(approval, { status: updateStatus });
    const decide = document.getElementById("decide");
    const reason = document.getElementById("reason");
    if (decide && reason) {
      // "r", then the reason, then Enter: submit as a rejection.
      reason.addEventListener("keydown", function (event) {
        if (event.key === "Enter" && decide.dataset.rejecting === "yes") {
          event.preventDefault();
          document.getElementById("reject").click();
        }
      });
    }
    const helpButton = document.getElementById("help-button");
    if (helpButton) helpButton.addEventListener("click", function () { document.getElementById("help").showModal(); });
    document.addEventListener("keydown", onKey);
    tick();
    setInterval(tick, 1000);
  });
})();
