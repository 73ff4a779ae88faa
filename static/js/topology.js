/*
 * pgdash: the topology view of one job (hosts -> ranks, process groups, the device mesh).
 *
 *   PGTopology.views(groups, ranks)    -> [{value, label, group?}] for the view selector
 *   PGTopology.findMesh(groups, ranks) -> {dims: [{family, size}], coords: Map} or null
 *   PGTopology.render(box, model)      draws or updates the view in `box`
 *
 * One DOM cell per rank (<span class="rk" data-rank data-state>), grouped in boxes: by host
 * (the default), by the groups of one family (e.g. every mesh_tp group), or as the mesh grid.
 * 1,024 ranks are ~1,200 elements: cheap to build once; later updates only touch the cells
 * whose state or highlight changed, and tooltips are made on hover. The container carries
 * data-highlight (the highlighted ranks, comma-separated) so tests and tools can read it.
 * Text from ranks (host names, devices) only ever goes through textContent.
 */
import { PG } from "./common.js";

const { el, clear } = PG;

const COMPACT_ABOVE = 64; // ranks; above this, cells show the rank number only
const DENSE_ABOVE = 256; // ranks; above this, cells are small squares (number on hover)

/** A group's family, as the server sends it (dashboard.state.family_of decides). */
function familyOf(g) {
  return g.family != null ? String(g.family) : String(g.name);
}

function families(groups) {
  const out = new Map(); // family -> [groups], in group order
  for (const g of groups || []) {
    const f = familyOf(g);
    if (!out.has(f)) out.set(f, []);
    out.get(f).push(g);
  }
  return out;
}

/**
 * The device mesh the groups form, if any: families named mesh_* whose groups each
 * partition the job's ranks, with as many distinct coordinates as ranks.
 */
function findMesh(groups, ranks) {
  const all = new Set((ranks || []).map((r) => r.rank));
  for (const g of groups || []) for (const r of g.ranks || []) all.add(r);
  if (all.size < 2) return null;
  const dims = [];
  const coords = new Map(); // rank -> [coordinate per dim]
  for (const [family, gs] of families(groups)) {
    if (!/^mesh_/.test(family) || gs.length < 1) continue;
    const seen = new Set();
    let ok = true;
    const size = (gs[0].ranks || []).length;
    for (const g of gs) {
      const members = (g.ranks || []).slice().sort((a, b) => a - b);
      if (members.length !== size) ok = false;
      members.forEach((r, i) => {
        if (seen.has(r)) ok = false;
        seen.add(r);
        if (!coords.has(r)) coords.set(r, []);
        coords.get(r)[dims.length] = i;
      });
    }
    if (!ok || seen.size !== all.size || size < 2) {
      for (const c of coords.values()) c.length = dims.length; // drop this dim's coords
      continue;
    }
    dims.push({ family: family, size: size, label: family.replace(/^mesh_/, "") });
  }
  if (dims.length < 2) return null;
  const product = dims.reduce((p, d) => p * d.size, 1);
  if (product !== all.size) return null;
  const keys = new Set();
  for (const c of coords.values()) keys.add(c.join(","));
  if (keys.size !== all.size) return null;
  return { dims: dims, coords: coords };
}

function views(groups, ranks) {
  const out = [{ value: "hosts", label: "All ranks by host" }];
  const mesh = findMesh(groups, ranks);
  if (mesh) {
    out.push({
      value: "mesh",
      label: "Mesh " + mesh.dims.map((d) => d.label).join(" \u00d7 ") + " (" + mesh.dims.map((d) => d.size).join(" \u00d7 ") + ")",
    });
  }
  const fams = families(groups);
  for (const [family, gs] of fams) {
    if (gs.length > 1) out.push({ value: "family:" + family, label: family + ": " + gs.length + " groups of " + (gs[0].ranks || []).length });
  }
  for (const [family, gs] of fams) {
    for (const g of gs) {
      const n = (g.ranks || []).length;
      out.push({
        value: "group:" + g.name,
        optgroup: gs.length > 1 ? family : "Groups",
        label: "group " + g.name + (family !== String(g.name) ? " \u00b7 " + family : "") + " (" + n + (n === 1 ? " rank)" : " ranks)"),
      });
    }
  }
  return out;
}

// ------------------------------------------------------------- layout --

/** Boxes of ranks for a view: [{title, sub, ranks: [rank], cls}] (+ mesh for "mesh"). */
function layout(model) {
  const ranks = model.ranks;
  const view = model.view || "hosts";
  if (view === "mesh") {
    const mesh = findMesh(model.groups, ranks);
    if (mesh) return { mesh: mesh };
  }
  if (view.startsWith("family:")) {
    const gs = families(model.groups).get(view.slice(7)) || [];
    if (gs.length) {
      return {
        boxes: gs.map((g) => ({
          title: "group " + g.name,
          sub: rangeLabel((g.ranks || []).slice().sort((a, b) => a - b)),
          ranks: (g.ranks || []).slice().sort((a, b) => a - b),
        })),
      };
    }
  }
  const byHost = new Map();
  for (const r of ranks) {
    const host = r.host == null || r.host === "" ? "(unknown host)" : String(r.host);
    if (!byHost.has(host)) byHost.set(host, []);
    byHost.get(host).push(r.rank);
  }
  // Ranks that are in a group but never reported still get a place.
  const known = new Set(ranks.map((r) => r.rank));
  const missing = new Set();
  for (const g of model.groups || []) for (const r of g.ranks || []) if (!known.has(r)) missing.add(r);
  const boxes = Array.from(byHost.entries())
    .map(([host, rs]) => ({ title: host, sub: rangeLabel(rs.sort((a, b) => a - b)), ranks: rs }))
    .sort((a, b) => a.ranks[0] - b.ranks[0]);
  if (missing.size) boxes.push({ title: "not reported", sub: missing.size + " ranks", ranks: Array.from(missing).sort((a, b) => a - b), cls: "host-missing" });
  let members = null;
  if (view.startsWith("group:")) {
    const g = (model.groups || []).find((x) => "group:" + x.name === view);
    if (g) members = new Set(g.ranks || []);
  }
  return { boxes: boxes, members: members };
}

/** "r8\u201315" for a contiguous run of ranks, else "5 ranks". */
function rangeLabel(sorted) {
  if (!sorted.length) return "no ranks";
  if (sorted.length === 1) return "r" + sorted[0];
  if (sorted[sorted.length - 1] - sorted[0] === sorted.length - 1) return "r" + sorted[0] + "\u2013" + sorted[sorted.length - 1];
  return sorted.length + " ranks";
}

function cell(rank, info, compact, dense) {
  const node = el("span", { class: "rk", dataset: { rank: String(rank) } });
  if (dense) return node;
  node.appendChild(el("b", { text: String(rank) }));
  if (!compact && info && info.device != null && info.device !== "") node.appendChild(el("small", { text: String(info.device) }));
  return node;
}

function signature(model, lay) {
  const ranks = model.ranks.map((r) => [r.rank, r.host, r.device]);
  return JSON.stringify([model.view, ranks, (model.groups || []).map((g) => [g.name, g.desc, (g.ranks || []).length]), !!lay.mesh]);
}

// ------------------------------------------------------------- render --

function render(box, model) {
  const lay = layout(model);
  const sig = signature(model, lay);
  let memo = box.__topo;
  if (!memo || memo.sig !== sig) {
    memo = box.__topo = build(box, model, lay);
    memo.sig = sig;
  }
  memo.model = model;
  update(box, memo, model);
}

function build(box, model, lay) {
  const info = new Map(model.ranks.map((r) => [r.rank, r]));
  const total = Math.max(model.ranks.length, info.size);
  const compact = total > COMPACT_ABOVE;
  const dense = total > DENSE_ABOVE;
  const cells = new Map();
  const mk = (rank) => {
    const c = cell(rank, info.get(rank), compact, dense);
    if (!cells.has(rank)) cells.set(rank, []);
    cells.get(rank).push(c);
    return c;
  };
  let content;
  if (lay.mesh) {
    content = buildMesh(lay.mesh, mk);
  } else if (!lay.boxes.length) {
    content = PG.empty("No ranks have reported yet.");
  } else {
    content = el(
      "div",
      { class: "hosts" },
      lay.boxes.map((b) =>
        el(
          "div",
          { class: "host" + (b.cls ? " " + b.cls : "") },
          el("div", { class: "host-head" }, el("span", { class: "host-name", text: b.title }), el("span", { class: "host-sub", text: b.sub })),
          el(
            "div",
            { class: "cells" },
            b.ranks.map((r) => {
              const c = mk(r);
              if (lay.members && !lay.members.has(r)) c.classList.add("out");
              return c;
            })
          )
        )
      )
    );
  }
  box.classList.toggle("compact", compact && !dense);
  box.classList.toggle("dense", dense);
  clear(box, content);
  if (!box.__topoWired) {
    box.__topoWired = true;
    box.addEventListener("mouseover", (ev) => {
      const c = ev.target.closest && ev.target.closest(".rk");
      if (c && box.__topo && box.__topo.model) c.title = box.__topo.model.describe(Number(c.dataset.rank));
    });
    box.addEventListener("click", (ev) => {
      const c = ev.target.closest && ev.target.closest(".rk");
      if (c && box.__topo && box.__topo.model && box.__topo.model.onSelectRank) box.__topo.model.onSelectRank(Number(c.dataset.rank));
    });
  }
  return { cells: cells, states: new Map(), hl: new Set() };
}

function buildMesh(mesh, mk) {
  const dims = mesh.dims;
  const rowDim = dims.length - 2;
  const colDim = dims.length - 1;
  const sliceDims = dims.slice(0, rowDim);
  const at = new Map(); // "coords" -> rank
  for (const [rank, c] of mesh.coords) at.set(c.join(","), rank);
  const nSlices = sliceDims.reduce((p, d) => p * d.size, 1);
  const slices = [];
  for (let s = 0; s < nSlices; s++) {
    // mixed radix: slice index -> coordinates of the leading dims
    const lead = [];
    let rest = s;
    for (let k = sliceDims.length - 1; k >= 0; k--) {
      lead[k] = rest % sliceDims[k].size;
      rest = Math.floor(rest / sliceDims[k].size);
    }
    const rows = [];
    rows.push(el("div", { class: "mesh-row mesh-colhead" }, el("span", { class: "mesh-corner", text: dims[rowDim].label + " \\ " + dims[colDim].label }), Array.from({ length: dims[colDim].size }, (_, j) => el("span", { class: "mesh-h", text: String(j) }))));
    for (let i = 0; i < dims[rowDim].size; i++) {
      rows.push(
        el(
          "div",
          { class: "mesh-row" },
          el("span", { class: "mesh-h", text: String(i) }),
          Array.from({ length: dims[colDim].size }, (_, j) => {
            const rank = at.get(lead.concat([i, j]).join(","));
            return rank === undefined ? el("span", { class: "rk void" }) : mk(rank);
          })
        )
      );
    }
    slices.push(
      el(
        "div",
        { class: "mesh-slice" },
        sliceDims.length ? el("div", { class: "host-head" }, el("span", { class: "host-name", text: sliceDims.map((d, k) => d.label + " " + lead[k]).join(", ") })) : null,
        el("div", { class: "mesh-grid" }, rows)
      )
    );
  }
  return el(
    "div",
    { class: "mesh" },
    el("p", { class: "muted small mesh-note", text: "Rows: " + dims[rowDim].family + ", columns: " + dims[colDim].family + (sliceDims.length ? "; one block per " + sliceDims.map((d) => d.family).join(" \u00d7 ") : "") + ". Each cell is a rank." }),
    el("div", { class: "mesh-slices" }, slices)
  );
}

function update(box, memo, model) {
  for (const [rank, nodes] of memo.cells) {
    const st = model.stateOf(rank) + (model.blamed && model.blamed(rank) ? "!" : "");
    if (memo.states.get(rank) !== st) {
      memo.states.set(rank, st);
      for (const n of nodes) {
        n.dataset.state = st.replace("!", "");
        if (st.endsWith("!")) n.dataset.blamed = "";
        else delete n.dataset.blamed;
      }
    }
  }
  const hl = model.highlight || new Set();
  for (const rank of memo.hl) if (!hl.has(rank)) for (const n of memo.cells.get(rank) || []) n.classList.remove("hl");
  for (const rank of hl) for (const n of memo.cells.get(rank) || []) n.classList.add("hl");
  memo.hl = new Set(hl);
  box.classList.toggle("has-hl", hl.size > 0);
  box.dataset.highlight = Array.from(hl).sort((a, b) => a - b).join(",");
}

export const PGTopology = Object.freeze({ views, findMesh, render, familyOf, families });
