// Rule form: a field that matters only for some values of another one (the groups for
// "members of the chosen groups", the key argument, the burst) is hidden while it neither
// matters nor holds a value, and shown as soon as it does. Without JavaScript all are shown.
"use strict";
(function () {
  function holdsValue(widget) {
    if (widget.tagName === "SELECT") {
      return widget.selectedOptions.length > 0;
    }
    return widget.value.trim() !== "";
  }

  function follow(widget) {
    const [name, values] = widget.dataset.throttleWhen.split("=");
    const wanted = values.split(",");
    const control = document.getElementById("id_" + name);
    const row = widget.closest(".form-row");
    if (!control || !row) {
      return;
    }
    const update = function () {
      const matters = wanted.includes(control.value);
      row.hidden = !(matters || holdsValue(widget) || row.classList.contains("errors"));
    };
    control.addEventListener("change", update);
    update();
  }

  function start() {
    document.querySelectorAll("[data-throttle-when]").forEach(follow);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
