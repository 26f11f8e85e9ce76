// Tollgate dashboard: progressive enhancements only; every page works
// without this script.
"use strict";
document.addEventListener("DOMContentLoaded", function () {
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
