// The policy editor: line numbers beside the textarea, error lines marked, scroll kept in step.
document.addEventListener("DOMContentLoaded", () => {
  const editor = document.querySelector(".editor");
  if (!editor) return;
  const gutter = editor.querySelector(".gutter");
  const source = editor.querySelector("textarea");
  const errorLines = new Set((editor.dataset.errorLines || "").split(",").filter(Boolean).map(Number));
  const render = () => {
    const count = source.value.split("\n").length;
    gutter.replaceChildren(...Array.from({ length: count }, (_, index) => {
      const line = document.createElement("span");
      line.textContent = String(index + 1);
      if (errorLines.has(index + 1)) line.className = "error-line";
      return line;
    }));
    gutter.scrollTop = source.scrollTop;
  };
  source.addEventListener("input", render);
  source.addEventListener("scroll", () => { gutter.scrollTop = source.scrollTop; });
  render();
});
