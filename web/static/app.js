// Tollgate dashboard: progressive enhancements only; every page works
// without this script.
"use strict";
document.addEventListener("DOMContentLoaded", function () {
  // The policy editor: a field that only some algorithms (scopes, refusal
  // modes) take shows for those only (data-when="algorithm=gcra,warm_up"),
  // and is disabled, so not sent, otherwise.
  document.querySelectorAll("form[data-policy-form]").forEach(function (form) {
    var update = function () {
      form.querySelectorAll("[data-when]").forEach(function (el) {
        var when = el.getAttribute("data-when").split("=");
        var control = form.elements.namedItem(when[0]);
        var show = !control || when[1].split(",").indexOf(control.value) >= 0;
        el.hidden = !show;
        el.querySelectorAll("input, select, textarea").forEach(function (c) { c.disabled = !show; });
      });
    };
    form.addEventListener("change", update);
    update();
  });

  // Copy buttons (the new key's secret), where the clipboard is available.
  if (!navigator.clipboard) return;
  document.querySelectorAll("button[data-copy]").forEach(function (b) {
    b.hidden = false;
    b.addEventListener("click", function () {
      var el = document.getElementById(b.getAttribute("data-copy"));
      if (!el) return;
      navigator.clipboard.writeText(el.textContent.trim()).then(function () {
        b.textContent = "Copied";
      });
    });
  });
});
