// The Denials chart: counts per bucket, drawn by the vendored Chart.js.
document.addEventListener("DOMContentLoaded", () => {
  const canvas = document.getElementById("denials-chart");
  if (!canvas || !window.Chart) return;
  const data = JSON.parse(document.getElementById("denials-chart-data").textContent);
  new Chart(canvas, {
    type: "bar",
    data: { labels: data.labels, datasets: [{ label: "denials", data: data.counts, backgroundColor: "#b42318" }] },
    options: {
      animation: false,
      plugins: { legend: { display: false } },
      scales: {
        x: { title: { display: true, text: "time (UTC)" }, ticks: { maxTicksLimit: 12 } },
        y: { beginAtZero: true, title: { display: true, text: "count" }, ticks: { precision: 0 } },
      },
    },
  });
});

// Auto-refresh: the page reloads itself every 30 s while the box is ticked (kept across reloads).
document.addEventListener("DOMContentLoaded", () => {
  const box = document.querySelector("[data-auto-refresh]");
  if (!box) return;
  box.checked = sessionStorage.getItem("airlock.denials.refresh") === "1";
  let timer = null;
  const arm = () => {
    clearTimeout(timer);
    sessionStorage.setItem("airlock.denials.refresh", box.checked ? "1" : "0");
    if (box.checked) timer = setTimeout(() => location.reload(), 30000);
  };
  box.addEventListener("change", arm);
  arm();
});
