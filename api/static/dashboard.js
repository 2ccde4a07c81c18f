// gpuest dashboard: live status by polling the page's JSON twin; upload progress. No dependencies.
"use strict";

const POLL_MS = 1000;
const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);

function fill(container, job) {
  const set = (field, value) => {
    const node = container.querySelector(`[data-field="${field}"]`);
    if (!node) return;
    if (field === "progress") node.value = value;
    else node.textContent = value;
    if (field === "status") node.className = `status status-${value}`;
  };
  set("status", job.status);
  set("progress", job.progress);
  set("percent", `${Math.round(job.progress * 100)} %`);
  set("stage", job.stage || "");
  set("device", job.device || "");
  set("attempts", job.attempts);
}

async function pollJob(section) {
  const response = await fetch(section.dataset.poll, { credentials: "same-origin" });
  if (!response.ok) return;
  const job = await response.json();
  fill(section, job);
  // A finished job's page has its result, plots and artifacts: load it once, then stop polling.
  if (TERMINAL.has(job.status)) { window.location.reload(); return; }
  setTimeout(() => pollJob(section), POLL_MS);
}

async function pollJobs(table) {
  const response = await fetch(table.dataset.poll, { credentials: "same-origin" });
  if (response.ok) {
    const page = await response.json();
    const known = new Set();
    for (const job of page.items) {
      const row = table.querySelector(`tr[data-job="${job.id}"]`);
      if (row) { fill(row, job); known.add(job.id); }
    }
    // A job this page does not show yet (submitted elsewhere): reload to list it.
    if (page.items.some((job) => !known.has(job.id))) { window.location.reload(); return; }
  }
  setTimeout(() => pollJobs(table), POLL_MS);
}

function uploadWithProgress(form) {
  const bar = document.getElementById("upload-progress");
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const request = new XMLHttpRequest();
    request.open("POST", form.action);
    request.setRequestHeader("Accept", "application/json");
    bar.hidden = false;
    request.upload.onprogress = (e) => { if (e.lengthComputable) bar.value = e.loaded / e.total; };
    request.onload = () => {
      if (request.status === 201) { window.location.reload(); return; }
      let detail = "the upload was refused";
      try { detail = JSON.parse(request.responseText).detail || detail; } catch (_) { /* not JSON */ }
      window.location.href = `/ui/datasets?error=${encodeURIComponent(detail)}`;
    };
    request.send(new FormData(form));
  });
}

document.addEventListener("DOMContentLoaded", () => {
  const live = document.getElementById("job-live");
  if (live && live.dataset.terminal !== "true") setTimeout(() => pollJob(live), POLL_MS);
  const table = document.getElementById("jobs");
  if (table) setTimeout(() => pollJobs(table), POLL_MS);
  const upload = document.getElementById("upload-form");
  if (upload) uploadWithProgress(upload);
});
