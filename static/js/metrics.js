// The Metrics page's charts, drawn by the vendored Chart.js.
document.addEventListener("DOMContentLoaded", () => {
  const source = document.getElementById("metrics-data");
  if (!source || !window.Chart) return;
  const data = JSON.parse(source.textContent);
  const quiet = { animation: false, plugins: { legend: { display: false } } };
  const starts = document.getElementById("starts-chart");
  if (starts) new Chart(starts, {
    data: {
      labels: data.starts.labels,
      datasets: [
        { type: "bar", label: "sessions started", data: data.starts.sessions, backgroundColor: "#2563eb", yAxisID: "y" },
        { type: "line", label: "p95 start (ms)", data: data.starts.p95_ms, borderColor: "#b42318", yAxisID: "ms" },
      ],
    },
    options: {
      animation: false,
      scales: {
        x: { title: { display: true, text: "time (UTC)" }, ticks: { maxTicksLimit: 12 } },
        y: { beginAtZero: true, title: { display: true, text: "sessions" }, ticks: { precision: 0 } },
        ms: { beginAtZero: true, position: "right", title: { display: true, text: "p95 start (ms)" },
              grid: { drawOnChartArea: false } },
      },
    },
  });
  const bars = (id, chart, color) => document.getElementById(id) && new Chart(document.getElementById(id), {
    type: "bar",
    data: { labels: chart.labels, datasets: [{ data: chart.counts, backgroundColor: color }] },
    options: { ...quiet, indexAxis: "y", scales: { x: { beginAtZero: true, title: { display: true, text: "count" },
                                                       ticks: { precision: 0 } } } },
  });
  bars("reasons-chart", data.denials, "#b42318");
  bars("states-chart", data.states, "#475467");
});
