// celery-routines panel: live refresh without a full reload. Vendored, no
// build step; without JavaScript the page refreshes through <noscript> meta.
(function () {
  "use strict";
  var body = document.body;
  if (!body || body.getAttribute("data-live") !== "1") return;
  var seconds = parseInt(body.getAttribute("data-refresh"), 10) || 5;
  function refresh() {
    // Never replace the page while someone is typing in a form.
    var active = document.activeElement;
    if (active && (active.tagName === "INPUT" || active.tagName === "SELECT")) return;
    fetch(window.location.href, { credentials: "same-origin" })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (text) {
        if (!text) return;
        var fresh = new DOMParser().parseFromString(text, "text/html").getElementById("main");
        var main = document.getElementById("main");
        if (fresh && main) main.replaceWith(fresh);
      })
      .catch(function () {});
  }
  window.setInterval(refresh, seconds * 1000);
})();

// The routine form: each field checked as the user types (a debounced POST
// to the validate endpoint, answered in the CLI's words, shown next to its
// field) and the next windows kept beside the form. Without JavaScript the
// form still posts and comes back with the same errors.
(function () {
  "use strict";
  var form = document.getElementById("routine-form");
  if (!form || !window.fetch || !document.getElementById("save")) return;
  var timer = null;
  var asked = 0;
  function typed() {
    var data = {};
    Array.prototype.forEach.call(form.elements, function (el) {
      if (el.name && el.name !== "csrf_token") data[el.name] = el.value;
    });
    return data;
  }
  function showErrors(errors) {
    Array.prototype.forEach.call(form.querySelectorAll(".field"), function (box) {
      var name = box.id.slice("field-".length);
      var message = errors[name] || "";
      var input = document.getElementById("f-" + name);
      document.getElementById("error-" + name).textContent = message;
      box.classList.toggle("invalid", message !== "");
      if (message) input.setAttribute("aria-invalid", "true");
      else input.removeAttribute("aria-invalid");
    });
  }
  function showWindows(answer) {
    var body = document.querySelector("#preview tbody");
    if (!body) return;
    body.textContent = "";
    answer.windows.forEach(function (w) {
      var row = body.insertRow();
      row.className = "window" + (w.dst_night ? " dst" : "");
      [w.local_text, w.utc_text, (w.dst_night ? "\u25d0 DST night" : "") +
        (w.note ? " \u00b7 " + w.note : "")].forEach(function (text) {
        row.insertCell().textContent = text;
      });
      row.cells[2].className = "note";
    });
    if (!answer.windows.length) {
      var cell = body.insertRow().insertCell();
      cell.colSpan = 3;
      cell.className = "sub";
      cell.textContent = answer.ok ? "no window left" : "no window to show yet";
    }
    var zone = document.getElementById("preview-zone");
    if (zone) zone.firstChild.textContent = "in " + answer.timezone + " and in UTC; \u25d0 marks a night the offset changes";
  }
  function check() {
    var mine = ++asked;
    fetch(form.getAttribute("data-validate"), {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRF-Token": form.getAttribute("data-csrf") },
      body: JSON.stringify({ fields: typed(), editing: form.getAttribute("data-editing") || null })
    })
      .then(function (response) { return response.ok ? response.json() : null; })
      .then(function (answer) {
        if (!answer || mine !== asked) return;  // a newer check is on its way
        showErrors(answer.fields);
        showWindows(answer);
        form.setAttribute("data-checked", String(mine));
      })
      .catch(function () {});
  }
  function later() {
    window.clearTimeout(timer);
    timer = window.setTimeout(check, 300);
  }
  form.addEventListener("input", later);
  form.addEventListener("change", later);
})();
