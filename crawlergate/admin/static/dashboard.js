// The crawlergate dashboard: reads stats (the totals) and series (the history) every few seconds and draws
// them with uPlot. Everything it needs is served by the gate itself.
"use strict";
(function () {
  const prefix = document.body.dataset.prefix;
  const REFRESH_MS = 2000;
  const charts = {};

  const percent = (value) => (value === null || value === undefined ? "–" : (100 * value).toFixed(1) + " %");
  const count = (value) => Number(value || 0).toLocaleString("en-US");
  const ms = (value) => (value === null || value === undefined ? "–" : value < 10 ? value.toFixed(2) + " ms" : Math.round(value).toLocaleString("en-US") + " ms");
  const seconds = (value) => (value < 1 ? Math.round(value * 1000) + " ms" : value < 120 ? value.toFixed(1) + " s" : value < 7200 ? (value / 60).toFixed(1) + " min" : (value / 3600).toFixed(1) + " h");
  // Binary units, as the settings' defaults are (64 MiB of L1, 1 GiB of L2).
  const bytes = (value) => (value >= 2 ** 30 ? (value / 2 ** 30).toFixed(2) + " GiB" : (value / 2 ** 20).toFixed(1) + " MiB");
  const when = (epoch) => (epoch ? new Date(epoch * 1000).toLocaleString() : "–");
  const text = (id, value) => { document.getElementById(id).textContent = value; };

  function rows(tableId, list, numeric) {
    const body = document.querySelector("#" + tableId + " tbody");
    body.replaceChildren(...list.map((cells) => {
      const row = document.createElement("tr");
      cells.forEach((cell, index) => {
        const td = document.createElement("td");
        td.textContent = cell;
        if (numeric(index)) td.className = "number";
        row.appendChild(td);
      });
      return row;
    }));
  }

  function showStats(data) {
    const crawler = data.crawler, human = data.human;
    text("crawler-hit-ratio", percent(crawler.hit_ratio));
    text("l1-hits", count(crawler.l1_hits));
    text("l2-hits", count(crawler.l2_hits));
    text("direct-hits", count(crawler.direct_hits || 0));
    // Direct hits exist only with nginx in front (front.direct_log); without it the part would always say 0.
    document.getElementById("direct-part").hidden = !crawler.direct_hits;
    text("misses", count(crawler.misses));
    text("crawler-requests", count(crawler.requests));
    text("crawler-p50", ms(crawler.ttfb_ms.p50));
    text("crawler-p99", ms(crawler.ttfb_ms.p99));
    text("human-requests", count(human.requests));
    text("human-p50", ms(human.ttfb_ms.p50));
    text("human-p99", ms(human.ttfb_ms.p99));
    // Scrapers behind browser user agents, served from the cache, and the crawler-only overload valve.
    text("suspect-requests", count(data.suspect.requests));
    text("unverified", count(data.evidence.unverified_claimants));
    // Operators' agents whose Web Bot Auth signature held (each operator is a family in the table below).
    text("signed", count(data.signed_agents.verified));
    text("valve", (data.valve.shedding ? "shedding" : "open") + ", " + count(data.valve.refused.valve) + " refused");
    text("share-requests", percent(data.crawler_share.requests));
    text("share-origin", percent(data.crawler_share.origin_time));
    text("time-saved", seconds(data.origin_time_saved_s));
    text("origin-requests", count(data.origin.requests));
    text("prefetches", count(data.prefetches.issued) + " prefetches, " + count(data.prefetches.useful) + " useful");
    text("l2-pages", count(data.l2.pages) + " pages" +
      (data.l2.loading === undefined ? "" : " (loading the folder: " + percent(data.l2.loading) + ")"));
    // The embedded L1 is each worker's own: these are the answering worker's. L2's figures are the folder's.
    const l1 = data.l1.max_bytes ? bytes(data.l1.used_bytes) + " of " + bytes(data.l1.max_bytes) + " in this worker's L1" : "L1 " + data.l1.backend;
    text("cache-detail", l1 + " · " + bytes(data.l2.bytes) + " of " + bytes(data.l2.max_bytes) + " in L2 · " +
      count(data.evictions.l1 + data.evictions.l2) + " evicted");
    text("status", "up " + seconds(data.uptime_s) + " · " + data.processes + " process" + (data.processes === 1 ? "" : "es") +
      " · updated " + new Date().toLocaleTimeString());
    // JSON objects arrive with their keys sorted by name: the most requests first again.
    const families = Object.entries(data.families).sort((a, b) => b[1].requests - a[1].requests).slice(0, 12);
    rows("families", families.map(([name, family]) => [name, family.tag, count(family.requests), count(family.hits),
      percent(family.requests ? family.hits / family.requests : 0)]), (index) => index >= 2);
    const regeneration = data.regeneration || {};
    const last = regeneration.last_window || {};
    rows("regeneration", [
      ["pages marked changed", count(data.dirty)],
      ["window", regeneration.enabled ? regeneration.window + (regeneration.auto_hour !== undefined ? " (" + String(regeneration.auto_hour).padStart(2, "0") + ":00)" : "") : "off"],
      ["next window", when(regeneration.next_window)],
      ["last window", last.start ? when(last.start) + ": " + count(last.pages) + " pages, " + count(last.changed) + " changed, " + count(last.errors) + " errors" : "none yet"],
      ["running now", regeneration.running ? "yes" : "no"],
    ], (index) => index === 1 && false);
    const notStored = Object.entries(data.not_stored).map(([reason, number]) => [reason, count(number)]);
    rows("not-stored", notStored.length ? notStored : [["none: every crawler page asked for was storable", ""]], (index) => index === 1);
  }

  function chart(id, series, data, yAxis) {
    const box = document.getElementById(id);
    if (!data[0].length) {
      box.innerHTML = '<p class="empty">no interval yet: the first point comes two seconds after the page opens</p>';
      return;
    }
    const width = Math.max(300, box.clientWidth);
    if (!charts[id] || charts[id].width !== width || charts[id].count !== series.length) {
      if (charts[id]) charts[id].plot.destroy();
      box.replaceChildren();
      const options = {
        width: width, height: 220, series: [{}].concat(series),
        scales: { x: { time: true }, y: yAxis.scale || {} },
        axes: [{}, { values: yAxis.values, size: 60 }],
        legend: { live: false },
      };
      charts[id] = { width: width, count: series.length, plot: new uPlot(options, data, box) };
    } else {
      charts[id].plot.setData(data);
    }
    // At least the last minute across, so the first points do not spread over years.
    const last = data[0][data[0].length - 1];
    charts[id].plot.setScale("x", { min: Math.min(data[0][0], last - 60), max: last });
  }

  function showSeries(points) {
    const t = points.map((p) => p.t);
    const ratio = (p, hits) => (p.crawler.lookups ? hits / p.crawler.lookups : null);
    const hitSeries = [
      { label: "L1", stroke: "#2563eb", width: 2 },
      { label: "L1 + L2", stroke: "#16a34a", width: 2 },
    ];
    const hitData = [t, points.map((p) => ratio(p, p.crawler.l1_hits)), points.map((p) => ratio(p, p.crawler.l1_hits + p.crawler.l2_hits))];
    // The third line only once nginx in front has answered a crawler: without it, it would hide the second.
    if (points.some((p) => p.crawler.direct_hits)) {
      hitSeries.push({ label: "L1 + L2 + direct (nginx)", stroke: "#9333ea", width: 2 });
      hitData.push(points.map((p) => ratio(p, p.crawler.l1_hits + p.crawler.l2_hits + (p.crawler.direct_hits || 0))));
    }
    chart("chart-hits", hitSeries, hitData,
      { scale: { range: [0, 1] }, values: (u, ticks) => ticks.map((v) => Math.round(v * 100) + " %") });
    const pick = (kind, stat) => points.map((p) => (p[kind].ttfb_ms ? Math.max(p[kind].ttfb_ms[stat], 0.01) : null));
    chart("chart-ttfb", [
      { label: "crawler p50", stroke: "#2563eb", width: 2 },
      { label: "crawler p90", stroke: "#93c5fd", width: 2 },
      { label: "human p50", stroke: "#dc2626", width: 2 },
      { label: "human p90", stroke: "#fca5a5", width: 2 },
    ], [t, pick("crawler", "p50"), pick("crawler", "p90"), pick("human", "p50"), pick("human", "p90")],
    {
      // A log scale; with no answer in any interval yet, a fixed 0.1–100 ms (uPlot's log ticks need a range).
      scale: { distr: 3, range: (u, min, max) => (min == null || max == null ? [0.1, 100] : uPlot.rangeLog(min, max, 10, true)) },
      values: (u, ticks) => ticks.map((v) => (v == null ? "" : (v < 1 ? v : Math.round(v)) + " ms")),
    });
    chart("chart-rate", [
      { label: "crawlers", stroke: "#2563eb", width: 2 },
      { label: "humans", stroke: "#dc2626", width: 2 },
    ], [t, points.map((p) => p.crawler.requests / p.seconds), points.map((p) => p.human.requests / p.seconds)],
    { values: (u, ticks) => ticks.map((v) => v + "/s") });
    chart("chart-share", [{ label: "crawler share of origin time", stroke: "#7c3aed", width: 2 }],
      [t, points.map((p) => p.crawler_origin_share)],
      { scale: { range: [0, 1] }, values: (u, ticks) => ticks.map((v) => Math.round(v * 100) + " %") });
  }

  async function refresh() {
    try {
      const [stats, series] = await Promise.all([fetch(prefix + "/stats"), fetch(prefix + "/series")]);
      if (!stats.ok) throw new Error("stats answered " + stats.status);
      showStats(await stats.json());
      if (series.ok) showSeries((await series.json()).points);
    } catch (error) {
      text("status", "cannot read the figures: " + error.message);
    } finally {
      setTimeout(refresh, REFRESH_MS);
    }
  }
  refresh();
})();
