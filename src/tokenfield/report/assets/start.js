document.querySelectorAll('.tokenfield-views').forEach(function (div) { tokenfieldShow(div.id); });
document.querySelectorAll('.tokenfield-figure').forEach(function (div) {
  var fig = JSON.parse(document.getElementById(div.id + '-data').textContent);
  fig.config = {displaylogo: false, responsive: true};
  Plotly.newPlot(div, fig);
});
