// Load a .heapsnapshot with heap-snapshot-toolkit (the Chromium DevTools frontend's own loader)
// and print what DevTools would show: node count, total size, and per-class aggregates.
// usage: node heapsnapshot_check.mjs FILE [ClassName ...]
import { createReadStream } from 'node:fs'
import { createRequire } from 'node:module'
const require = createRequire(process.env.OMNIPROF_NODE_MODULES + '/')
const { parse } = require('heap-snapshot-toolkit')
const snap = await parse(createReadStream(process.argv[2], 'utf-8'))
const stats = snap.getStatistics()
const wanted = new Set(process.argv.slice(3))
const classes = {}
for (const agg of Object.values(snap.aggregatesWithFilter({}))) {
  if (wanted.has(agg.name)) classes[agg.name] = { count: agg.count, self: agg.self }
}
console.log(JSON.stringify({ nodeCount: snap.nodeCount, total: stats.total, classes }))
