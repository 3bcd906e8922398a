// The sequence view's conveniences (acp_bridge/observe/sequence_html.py): the view works without
// them. A session filter, "open every JSON", and the partner of the message under the pointer
// highlighted. Reads the page's classes and data attributes only; never writes markup (nothing
// from a trace is ever turned into HTML here).
"use strict";
(function () {
  for (const view of document.querySelectorAll(".acp-seq")) {
    const tools = view.querySelector(".tools");
    if (!tools) continue;
    tools.hidden = false;
    const rows = Array.from(view.querySelectorAll("li.row.msg"));
    const pick = tools.querySelector("select.pick-session");
    if (pick) {
      pick.addEventListener("change", () => {
        for (const row of rows) {
          row.hidden = pick.value !== "" && row.dataset.session !== pick.value;
        }
      });
    }
    const openAll = tools.querySelector("button.open-all");
    let opened = false;
    openAll.addEventListener("click", () => {
      opened = !opened;
      for (const details of view.querySelectorAll("li.row.msg details")) details.open = opened;
      openAll.textContent = opened ? "Close every JSON" : "Open every JSON";
    });
    const partner = (row) => {
      const id = row && row.dataset.partner;
      return id ? document.getElementById(id) : null;
    };
    const mark = (event, on) => {
      const row = event.target.closest("li.row.msg");
      const other = partner(row);
      if (!other) return;
      row.classList.toggle("hl", on);
      other.classList.toggle("hl", on);
    };
    view.addEventListener("mouseover", (event) => mark(event, true));
    view.addEventListener("mouseout", (event) => mark(event, false));
  }
})();
