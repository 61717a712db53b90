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
