// Live document status for the admin: badges of pending and processing documents (and the
// dashboard's queue figures) are refreshed from the status endpoint until nothing is in flight.
"use strict";
(function () {
  const ACTIVE = new Set(["pending", "processing"]);
  const INTERVAL_MS = 1500;

  function statusUrl() {
    const holder = document.querySelector("[data-kb-status-url]");
    return holder ? holder.dataset.kbStatusUrl : null;
  }

  function activeIds() {
    const ids = new Set();
    document.querySelectorAll("[data-kb-doc]").forEach(function (badge) {
      if (ACTIVE.has(badge.dataset.kbStatus)) ids.add(badge.dataset.kbDoc);
    });
    return Array.from(ids);
  }

  function queueShown() {
    return document.querySelector("[data-kb-queue]") !== null;
  }

  function queueBusy() {
    return ["pending", "processing"].some(function (name) {
      const figure = document.querySelector('[data-kb-queue="' + name + '"]');
      return figure && figure.textContent.trim() !== "0";
    });
  }

  function announce(text) {
    const region = document.getElementById("kb-live");
    if (region) region.textContent = text;
  }

  function updateBadge(badge, doc) {
    const previous = badge.dataset.kbStatus;
    badge.dataset.kbStatus = doc.status;
    badge.className = "kb-status kb-status-" + doc.status;
    badge.textContent = doc.label;
    if (doc.error) badge.title = doc.error_code + ": " + doc.error;
    else badge.removeAttribute("title");
    return previous !== doc.status && !ACTIVE.has(doc.status);
  }

  function updateProgress(holder, doc) {
    const bar = holder.querySelector("progress");
    const text = holder.querySelector(".kb-progress-text");
    const embedded = Math.min(doc.embedded_count, doc.chunk_count);
    if (bar) {
      bar.max = Math.max(doc.chunk_count, 1);
      bar.value = embedded;
      bar.textContent = embedded + " / " + doc.chunk_count;
    }
    if (text) text.textContent = embedded + " / " + doc.chunk_count;
  }

  function apply(data) {
    const finished = [];
    data.documents.forEach(function (doc) {
      document.querySelectorAll('[data-kb-doc="' + doc.id + '"]').forEach(function (badge) {
        if (updateBadge(badge, doc)) finished.push(doc.label);
      });
      document.querySelectorAll('[data-kb-progress="' + doc.id + '"]').forEach(function (holder) {
        updateProgress(holder, doc);
      });
    });
    Object.keys(data.queue || {}).forEach(function (name) {
      const figure = document.querySelector('[data-kb-queue="' + name + '"]');
      if (figure) figure.textContent = data.queue[name];
    });
    if (finished.length) {
      announce(finished.length + " document" + (finished.length === 1 ? "" : "s") + " finished: " + finished.join(", "));
    }
  }

  function poll() {
    const url = statusUrl();
    const ids = activeIds();
    if (!url || (!ids.length && !(queueShown() && queueBusy()))) return;
    const query = ids.map(function (id) { return "id=" + encodeURIComponent(id); }).join("&");
    fetch(url + (query ? "?" + query : ""), { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (response) { return response.ok ? response.json() : null; })
      .then(function (data) { if (data) apply(data); })
      .catch(function () { /* a missed poll is retried on the next tick */ })
      .finally(function () { window.setTimeout(poll, INTERVAL_MS); });
  }

  document.addEventListener("DOMContentLoaded", function () { window.setTimeout(poll, INTERVAL_MS); });
})();
