// A Pipeline's stages as the pages show them: the spec's shape (name, kind, dependsOn, fromBest) with the
// status's numbers (phase, cost, wall time, child, the best cell taken), each at its depth in the DAG; the
// same reading as the CLI's (nodus_cli/pipelines.py).

export function stageViews(pipeline) {
  const spec = pipeline.spec || {};
  const status = pipeline.status || {};
  const known = new Map((status.stages || []).map((s) => [s.name, s]));
  const views = (spec.stages || []).map((stage) => {
    const st = known.get(stage.name) || {};
    known.delete(stage.name);
    const template = stage.template || {};
    return {
      name: stage.name,
      kind: st.kind || (template.job ? "Job" : template.sweep ? "Sweep" : null),
      dependsOn: stage.dependsOn || [],
      phase: st.phase || null,
      costUSD: st.costUSD || null,
      wallSeconds: st.wallSeconds ?? null,
      object: st.object || null,
      message: st.message || null,
      wanted: stage.fromBest || null,
      best: st.fromBest || null,
    };
  });
  // A stage only the status knows (it should not happen): shown rather than lost.
  for (const st of known.values()) {
    views.push({ ...st, dependsOn: [], wanted: null, best: st.fromBest || null });
  }
  return withDepths(views);
}

function withDepths(views) {
  // A stage's depth: 0 without dependencies, else one more than its deepest dependency (a cycle, which the
  // gateway refuses, counts as no dependency).
  const byName = new Map(views.map((v) => [v.name, v]));
  const depths = new Map();
  const depthOf = (v, path) => {
    if (depths.has(v.name)) return depths.get(v.name);
    let depth = 0;
    for (const dep of v.dependsOn) {
      const d = byName.get(dep);
      if (d && !path.has(dep)) depth = Math.max(depth, depthOf(d, new Set([...path, dep])) + 1);
    }
    depths.set(v.name, depth);
    return depth;
  };
  return views.map((v) => ({ ...v, depth: depthOf(v, new Set([v.name])) }));
}

export function stagesDone(pipeline) {
  const views = stageViews(pipeline);
  return { succeeded: views.filter((v) => v.phase === "Succeeded").length, total: views.length };
}

export function bestText(view) {
  // "best of grid by Throughput: cell 3 (LR=0.01, L4:1)"; before the stage exists, what it will take.
  const chosen = view.best;
  if (chosen) {
    const params = chosen.params || {};
    const what = Object.keys(params).sort().map((k) => `${k}=${params[k]}`);
    for (const x of [chosen.gpu, chosen.region]) if (x) what.push(x);
    const cell = chosen.cell !== null && chosen.cell !== undefined ? `cell ${chosen.cell}` : `cell ${chosen.object || "?"}`;
    return `best of ${chosen.stage || "?"} by ${chosen.by || "Cost"}: ${cell}${what.length ? ` (${what.join(", ")})` : ""}`;
  }
  if (view.wanted) return `best of ${view.wanted.stage || "?"} by ${view.wanted.by || "Cost"}: not chosen yet`;
  return null;
}
