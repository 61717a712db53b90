// Shared by the live pages: a WebSocket that reconnects, and confirmation for dangerous forms.
window.Airlock = window.Airlock || {};

Airlock.connect = (path, onEvent, statusElement) => {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  let delay = 500;
  const setStatus = (text) => { if (statusElement) statusElement.textContent = text; };
  const open = () => {
    const socket = new WebSocket(`${scheme}//${location.host}${path}`, ["airlock.v1"]);
    socket.addEventListener("open", () => { delay = 500; setStatus("live"); });
    socket.addEventListener("message", (message) => onEvent(JSON.parse(message.data)));
    socket.addEventListener("close", (event) => {
      if (event.code === 4403) { setStatus("not allowed"); return; }
      setStatus("reconnecting…");
      setTimeout(open, delay);
      delay = Math.min(delay * 2, 10000);
    });
  };
  open();
};

document.addEventListener("submit", (event) => {
  const question = event.target.dataset && event.target.dataset.confirm;
  if (question && !window.confirm(question)) event.preventDefault();
});

// The top bar on a narrow screen: its sections fold under a Menu button.
document.addEventListener("DOMContentLoaded", () => {
  const toggle = document.querySelector("[data-menu-toggle]");
  toggle?.addEventListener("click", () => {
    const open = toggle.getAttribute("aria-expanded") !== "true";
    toggle.setAttribute("aria-expanded", String(open));
    document.querySelector(".topbar").classList.toggle("menu-open", open);
  });
});
