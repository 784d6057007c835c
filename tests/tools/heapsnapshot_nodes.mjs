// Load a .heapsnapshot with heap-snapshot-toolkit (the Chromium DevTools frontend's own loader) and
// print, for every node whose class is named on the command line, what DevTools computes for it:
// self and retained size, distance from the root, and its immediate dominator (class and id).
// usage: node heapsnapshot_nodes.mjs FILE ClassName [ClassName ...]
import { createReadStream } from 'node:fs'
import { createRequire } from 'node:module'
const require = createRequire(process.env.OMNIPROF_NODE_MODULES + '/')
const { parse } = require('heap-snapshot-toolkit')
const snap = await parse(createReadStream(process.argv[2], 'utf-8'))
const wanted = new Set(process.argv.slice(3))
const out = []
for (let i = 0; i < snap.nodeCount; i++) {
  const node = snap.createNode(i * snap.nodeFieldCount)
  if (!wanted.has(node.className())) continue
  const dom = snap.createNode(node.dominatorIndex())
  out.push({ id: node.id(), name: node.className(), self: node.selfSize(), retained: node.retainedSize(),
             distance: node.distance(), dominator: dom.className(), dominatorId: dom.id() })
}
console.log(JSON.stringify({ nodeCount: snap.nodeCount, nodes: out }))
