// countersign web inbox: live updates over server-sent events, time left, batch selection
// and keyboard shortcuts. Every HTML fragment comes from the server, already escaped.
"use strict";

(function () {
  function fragment(html) {
    const template = document.createElement("template");
    template.innerHTML = html;
    return template.content;
  }

  // ---- connection ----
  // Whether this page hears from the inbox, and whether the inbox hears from the server: while
  // either is not the case the page says so, since what it shows may be out of date.
  // Until the stream's first `link` event says otherwise, the server's link is as the page was
  // rendered: a banner shown at load stays up when the stream opens (no blink off and on).
  const rendered = document.getElementById("connection");
  const link = { page: true, server: !rendered || rendered.hidden };

  function showConnection() {
    const banner = document.getElementById("connection");
    if (!banner) return;
    const text = !link.page ? banner.dataset.pageLost : !link.server ? banner.dataset.serverLost : "";
    banner.textContent = text;
    banner.hidden = text === "";
  }

  // The page's event stream. Each connection resumes after the last seq the page applied (at
  // first the seq it was rendered at; the browser's own reconnects send Last-Event-ID).
  const streams = [];

  function open(stream) {
    const element = stream.element;
    const url = element.dataset.events + "&after=" + encodeURIComponent(element.dataset.seq);
    const source = new EventSource(url);
    stream.source = source;
    Object.keys(stream.handlers).forEach(function (name) {
      source.addEventListener(name, function (event) {
        element.dataset.seq = event.lastEventId;
        stream.handlers[name](JSON.parse(event.data));
      });
    });
    source.addEventListener("link", function (event) {
      link.server = JSON.parse(event.data).up === true;
      showConnection();
    });
    source.addEventListener("open", function () {
      stream.delay = 1000;
      document.body.dataset.live = "open";
      link.page = true;
      showConnection();
    });
    source.addEventListener("error", function () {
      document.body.dataset.live = "reconnecting";
      link.page = false;
      showConnection();
      // The browser retries a dropped connection on its own, but gives up on an error
      // answer (the inbox restarting behind a proxy, a session gone): then retry here.
      if (source.readyState === EventSource.CLOSED) {
        stream.source = null;
        stream.retry = setTimeout(function () { stream.retry = null; open(stream); }, stream.delay);
        stream.delay = Math.min(stream.delay * 2, 30000);
      }
    });
  }

  function close(stream) {
    if (stream.retry) clearTimeout(stream.retry);
    stream.retry = null;
    if (stream.source) stream.source.close();
    stream.source = null;
  }

  function follow(element, handlers) {
    const stream = { element: element, handlers: handlers, source: null, retry: null, delay: 1000 };
    streams.push(stream);
    open(stream);
  }

  // A page kept in the back/forward cache must not keep its stream: Chromium allows six
  // HTTP/1.1 connections per host, and cached pages holding them stall the next page loads.
  window.addEventListener("pagehide", function () { streams.forEach(close); });
  window.addEventListener("pageshow", function (event) {
    if (event.persisted) streams.forEach(function (stream) { if (!stream.source) open(stream); });
  });

  // ---- decision forms ----
  // Enter in a field of a decision form never decides: only a click on Approve or Reject, or
  // a shortcut, does. (Without this script the form's first submit button, which names no
  // verdict, makes the server answer the same.)
  function formError(form, text) {
    const error = form.querySelector(".form-error");
    if (!error) return;
    error.textContent = text;
    error.hidden = text === "";
  }

  const ENTER_DOES_NOT_DECIDE = "Nothing was decided: Enter does not decide. Click Approve or Reject " +
    "(or, outside a text field, press a to approve, or r to type a reason and reject).";

  function guardEnter(form) {
    form.addEventListener("keydown", function (event) {
      if (event.key !== "Enter" || event.target.tagName !== "INPUT") return;
      event.preventDefault();
      // "r", then the reason, then Enter: the reject shortcut.
      if (form.id === "decide" && event.target.id === "reason" && form.dataset.rejecting === "yes") {
        document.getElementById("reject").click();
        return;
      }
      formError(form, ENTER_DOES_NOT_DECIDE);
    });
  }

  // ---- passkeys (docs/security.md#passkey-step-up) ----
  // The server checks what the browser's authenticator answers; this only asks for it and
  // puts the answer (base64url) in the form's hidden fields.
  function fromBase64url(text) {
    const base64 = text.replace(/-/g, "+").replace(/_/g, "/") + "===".slice((text.length + 3) % 4);
    return Uint8Array.from(atob(base64), function (c) { return c.charCodeAt(0); });
  }

  function toBase64url(buffer) {
    let raw = "";
    new Uint8Array(buffer).forEach(function (b) { raw += String.fromCharCode(b); });
    return btoa(raw).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  }

  function credentialList(form) {
    return (form.dataset.credentials || "").split(",").filter(Boolean).map(function (id) {
      return { type: "public-key", id: fromBase64url(id) };
    });
  }

  function setField(form, name, value) {
    form.querySelector("input[name='" + name + "']").value = value;
  }

  // Approve on a step-up approval: first an assertion of the approver's passkey for the
  // challenge the page carries (it commits to this approval and its arguments).
  function stepUp(form) {
    form.addEventListener("submit", function (event) {
      const button = event.submitter;
      if (!button || button.value !== "approve" || form.dataset.asserted === "yes") return;
      event.preventDefault();
      navigator.credentials.get({ publicKey: {
        challenge: fromBase64url(form.dataset.challenge),
        allowCredentials: credentialList(form),
        userVerification: "required",
        timeout: 120000,
      } }).then(function (credential) {
        setField(form, "passkey_credential_id", toBase64url(credential.rawId));
        setField(form, "passkey_client_data", toBase64url(credential.response.clientDataJSON));
        setField(form, "passkey_authenticator_data", toBase64url(credential.response.authenticatorData));
        setField(form, "passkey_signature", toBase64url(credential.response.signature));
        form.dataset.asserted = "yes";
        form.requestSubmit(button);
      }).catch(function (failure) {
        formError(form, "Nothing was decided: no passkey answered (" + failure.message + ").");
      });
    });
  }

  function registerPasskey(form) {
    form.addEventListener("submit", function (event) {
      if (form.dataset.created === "yes") return;
      event.preventDefault();
      navigator.credentials.create({ publicKey: {
        challenge: fromBase64url(form.dataset.challenge),
        rp: { id: form.dataset.rpId, name: "countersign" },
        user: {
          id: fromBase64url(form.dataset.userHandle),
          name: form.dataset.userName,
          displayName: form.dataset.userName,
        },
        pubKeyCredParams: [{ type: "public-key", alg: -7 }, { type: "public-key", alg: -8 }],
        excludeCredentials: credentialList(form),
        authenticatorSelection: { residentKey: "preferred", userVerification: "required" },
        attestation: "none",
        timeout: 120000,
      } }).then(function (credential) {
        setField(form, "client_data", toBase64url(credential.response.clientDataJSON));
        setField(form, "attestation_object", toBase64url(credential.response.attestationObject));
        form.dataset.created = "yes";
        form.requestSubmit();
      }).catch(function (failure) {
        formError(form, "No passkey was registered (" + failure.message + ").");
      });
    });
  }

  // ---- inbox batch ----
  function refreshTicked() {
    const review = document.getElementById("review");
    if (!review) return;
    const ticked = document.querySelectorAll("#rows input[type=checkbox]:checked").length;
    review.textContent = "Review selected (" + ticked + ")";
    if (ticked > 0) formError(review.form, "");
    return ticked;
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
    refreshTicked();
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
        refreshTicked();
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
      const selectAgent = document.getElementById("select-agent");
      if (selectAgent) selectAgent.addEventListener("change", function () {
        rows().forEach(function (row) {
          if (row.dataset.agent === selectAgent.value) row.querySelector("input[type=checkbox]").checked = true;
        });
        // Back to the prompt: the control ticks, it does not hold a choice.
        selectAgent.value = "";
        refreshTicked();
      });
      const batch = document.getElementById("batch");
      batch.addEventListener("change", refreshTicked);
      batch.addEventListener("submit", function (event) {
        if (refreshTicked() > 0) return;
        event.preventDefault();
        formError(batch, "Tick at least one approval (or choose an agent in Select all of…), then click Review selected.");
      });
      refreshCount();
    }
    const approval = document.getElementById("approval");
    if (approval) follow(approval, { status: updateStatus });
    document.querySelectorAll("form.decision").forEach(guardEnter);
    document.querySelectorAll("form[data-step-up=passkey]").forEach(stepUp);
    const registration = document.getElementById("register-passkey");
    if (registration) registerPasskey(registration);
    const helpButton = document.getElementById("help-button");
    if (helpButton) helpButton.addEventListener("click", function () { document.getElementById("help").showModal(); });
    document.addEventListener("keydown", onKey);
    tick();
    setInterval(tick, 1000);
  });
})();
