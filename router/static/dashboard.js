// warmgate's dashboard: live through GET /events; the server renders, this swaps the view in
// (GET /?fragment=1), keeps times and countdowns current, and sends the actions with the admin
// token kept in sessionStorage. No build step, no dependencies.
(function () {
  "use strict";
  var view = document.getElementById("view");
  var live = document.getElementById("live");
  var notice = document.getElementById("notice");
  var form = document.getElementById("token-form");
  var input = document.getElementById("token");
  var KEY = "warmgate-admin-token";
  var skew = 0;  // server seconds minus this browser's
  var fetching = false, again = false, pending = null;

  function now() { return Date.now() / 1000 + skew; }
  function setNow(serverNow) {
    if (serverNow) { skew = Number(serverNow) - Date.now() / 1000; }
  }
  function span(s) {
    s = Math.max(0, Math.round(s));
    if (s < 60) { return s + "s"; }
    if (s < 3600) { return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s"; }
    return Math.floor(s / 3600) + "h" + String(Math.floor(s % 3600 / 60)).padStart(2, "0") + "m";
  }
  function tick() {
    var t = now();
    view.querySelectorAll(".ago").forEach(function (el) {
      el.textContent = span(t - Number(el.dataset.epoch)) + " ago";
    });
    view.querySelectorAll(".countdown").forEach(function (el) {
      el.textContent = span(Number(el.dataset.epoch) - t);
    });
    view.querySelectorAll(".elapsed").forEach(function (el) {
      el.textContent = span(t - Number(el.dataset.epoch));
    });
  }
  function localTimes() {
    view.querySelectorAll("time[data-epoch]").forEach(function (el) {
      el.textContent = new Date(Number(el.dataset.epoch) * 1000).toLocaleTimeString();
    });
  }
  function refresh() {
    if (fetching) { again = true; return; }
    fetching = true;
    fetch("/?fragment=1", {cache: "no-store"}).then(function (r) {
      if (!r.ok) { throw new Error(r.status); }
      setNow(r.headers.get("X-Now"));
      return r.text();
    }).then(function (html) {
      view.innerHTML = html;
      localTimes(); tick();
    }).catch(function () { /* the next event tries again */ }).finally(function () {
      fetching = false;
      if (again) { again = false; refresh(); }
    });
  }
  function say(text, ok) {
    notice.textContent = text;
    notice.className = ok ? "ok" : "error";
  }

  function act(button) {
    var target = button.dataset.target, action = button.dataset.action;
    var headers = {};
    var token = sessionStorage.getItem(KEY);
    if (token) { headers.Authorization = "Bearer " + token; }
    fetch("/targets/" + encodeURIComponent(target) + "/" + action, {method: "POST", headers: headers})
      .then(function (r) {
        return r.json().catch(function () { return {}; }).then(function (body) {
          var words = action + " " + target;
          if (r.ok) { say(words + ": " + body.result, true); return; }
          var why = (body.error && body.error.message) || r.statusText;
          say(words + " refused (" + r.status + "): " + why, false);
          if (r.status === 401) {
            sessionStorage.removeItem(KEY);
            pending = button;
            form.hidden = false;
            input.focus();
          }
        });
      })
      .catch(function (err) { say(action + " " + target + " failed: " + err, false); });
  }

  document.addEventListener("click", function (ev) {
    var button = ev.target.closest("button[data-action]");
    if (button && !button.disabled) { act(button); }
  });
  form.addEventListener("submit", function (ev) {
    ev.preventDefault();
    sessionStorage.setItem(KEY, input.value.trim());
    input.value = "";
    form.hidden = true;
    if (pending) { var b = pending; pending = null; act(b); }
    else { say("token kept for this session", true); }
  });
  if (document.body.dataset.actions === "1" && !sessionStorage.getItem(KEY)) {
    form.hidden = false;
  }

  setNow(view.dataset.now);
  localTimes(); tick();
  setInterval(tick, 1000);
  if (window.EventSource) {
    var events = new EventSource("/events");
    events.addEventListener("open", function () {
      live.textContent = "live"; live.className = "live on";
    });
    events.addEventListener("error", function () {
      live.textContent = "reconnecting…"; live.className = "live off";
    });
    events.addEventListener("snapshot", function (ev) {
      try { setNow(JSON.parse(ev.data).now); } catch (e) { /* keep the old skew */ }
      refresh();
    });
    events.addEventListener("change", refresh);
  }
})();
