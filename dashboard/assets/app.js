// Pelican dashboard: the only script. It reloads the page every 5 seconds
// while the auto-refresh box is ticked (remembered in localStorage). Every
// action works without it: confirmations are pages rendered by the server.
(function () {
  "use strict";
  var box = document.getElementById("autorefresh");
  if (!box) return;
  var key = "pelican.autorefresh";
  var timer = null;
  function arm() {
    if (timer) clearTimeout(timer);
    timer = box.checked ? setTimeout(function () { location.reload(); }, 5000) : null;
  }
  try { box.checked = localStorage.getItem(key) !== "off"; } catch (e) { box.checked = true; }
  box.addEventListener("change", function () {
    try { localStorage.setItem(key, box.checked ? "on" : "off"); } catch (e) {}
    arm();
  });
  arm();
})();
