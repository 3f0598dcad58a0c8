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
