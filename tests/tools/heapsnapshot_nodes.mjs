// Load a .heapsnapshot with heap-snapshot-toolkit (the Chromium DevTools frontend's own loader) and
// print, for every node whose class is named on the command line, what DevTools computes for it:
// self and retained size, distance from the root, its immediate dominator (class and id) and that
// one's dominator (dominator2).
// With --edges, also each node's outgoing edges as DevTools reads them (type, name, and the target's
// name, class, type and self size); an internal "__dict__" edge lists the dict's own edges too.
// usage: node heapsnapshot_nodes.mjs FILE [--edges] ClassName [ClassName ...]
import { createReadStream } from 'node:fs'
import { createRequire } from 'node:module'
const require = createRequire(process.env.OMNIPROF_NODE_MODULES + '/')
const { parse } = require('heap-snapshot-toolkit')
const snap = await parse(createReadStream(process.argv[2], 'utf-8'))
const args = process.argv.slice(3)
const withEdges = args.includes('--edges')
const wanted = new Set(args.filter(a => a !== '--edges'))
function edgesOf (node, depth) {
  const out = []
  for (let it = node.edges(); it.hasNext(); it.next()) {
    const e = it.edge
    const to = e.node()
    const item = { type: e.type(), name: e.name(), to: to.name(), toClass: to.className(), toType: to.type(),
                   toSelf: to.selfSize() }
    if (depth > 0 && e.name() === '__dict__') item.edges = edgesOf(to, depth - 1)
    out.push(item)
  }
  return out
}
const out = []
for (let i = 0; i < snap.nodeCount; i++) {
  const node = snap.createNode(i * snap.nodeFieldCount)
  if (!wanted.has(node.className())) continue
  const dom = snap.createNode(node.dominatorIndex())
  const dom2 = snap.createNode(dom.dominatorIndex())
  const item = { id: node.id(), name: node.className(), self: node.selfSize(), retained: node.retainedSize(),
                 distance: node.distance(), dominator: dom.className(), dominatorId: dom.id(),
                 dominator2: dom2.className(), dominator2Id: dom2.id() }
  if (withEdges) item.edges = edgesOf(node, 1)
  out.push(item)
}
console.log(JSON.stringify({ nodeCount: snap.nodeCount, nodes: out }))
