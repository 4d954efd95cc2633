(function () {
  function frameData(fig, view, run, j, k) {
    var t = fig.data[j], m = t.meta || {}, three = t.type === 'scatter3d', o = {};
    var axes = three ? ['x', 'y', 'z'] : ['x', 'y'];
    if (m.kind === 'path') {
      axes.forEach(function (a) { o[a] = t[a].slice(0, k + 1); });
    } else if (m.kind === 'ends') {
      axes.forEach(function (a) { o[a] = m.src.map(function (s) { return fig.data[s][a][k]; }); });
    } else if (m.kind === 'gen') {
      var pts = view.gen[String(m.g)][k];
      axes.forEach(function (a) { o[a] = pts[a]; });
      o.text = run.G[m.g][k];
    }
    return o;
  }
  function build(run, key) {
    var view = run.views[key];
    var fig = {data: JSON.parse(JSON.stringify(view.data)), layout: view.layout};
    var last = run.times.length - 1;
    fig.data.forEach(function (t) {
      var m = t.meta || {};
      if (m.kind === 'path') t.text = run.H[m.h];
      if (m.kind === 'gen') t.text = run.G[m.g][last];
    });
    fig.frames = run.frames.map(function (k) {
      return {name: 't' + k, traces: view.moving,
              data: view.moving.map(function (j) { return frameData(fig, view, run, j, k); })};
    });
    return fig;
  }
  window.tokenfieldRuns = {};
  window.tokenfieldShow = function (id) {
    var run = window.tokenfieldRuns[id];
    if (!run) {
      var source = document.getElementById(id + '-data');
      run = window.tokenfieldRuns[id] = JSON.parse(source.textContent);
    }
    var div = document.getElementById(id);
    var controls = document.querySelectorAll('[data-plot="' + id + '"]');
    var state = {dim: '2d', frame: run.default.split('-')[1]};
    controls.forEach(function (c) { if (c.checked) state[c.name.split(':')[0]] = c.value; });
    var key = state.dim + '-' + state.frame;
    if (div.dataset.view === key) return;
    if (div.dataset.view) Plotly.purge(div);
    div.dataset.view = key;
    var fig = build(run, key);
    Plotly.newPlot(div, fig.data, fig.layout, {displaylogo: false, responsive: true})
      .then(function () { return Plotly.addFrames(div, fig.frames); });
  };
})();
