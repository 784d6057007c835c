// Opens a URL of the real Perfetto UI in headless Chromium and reports what the page shows.
// usage: node [--experimental-websocket] perfetto_ui_driver.js URL TIMEOUT_MS EXPECTED_JSON
// Prints one JSON object: {loaded, timeline_text, info_text, exceptions}. Driven over the Chrome
// DevTools protocol (a debugging port chosen by Chromium, read from DevToolsActivePort).
'use strict';
const {spawn} = require('child_process');
const fs = require('fs');
const os = require('os');
const path = require('path');
const http = require('http');

const [url, timeoutMs, expectedJson] = process.argv.slice(2);
const expected = JSON.parse(expectedJson || '[]');
const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'omniprof-chromium-'));
const chrome = spawn(process.env.CHROMIUM || 'chromium', [
  '--headless=new', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run',
  '--window-size=1600,1000', '--remote-debugging-port=0', `--user-data-dir=${profile}`, 'about:blank'],
  {stdio: 'ignore'});
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const deadline = Date.now() + Number(timeoutMs);
const finish = (result, code) => {
  chrome.kill('SIGKILL');
  try { fs.rmSync(profile, {recursive: true, force: true}); } catch (e) { /* best effort */ }
  process.stdout.write(JSON.stringify(result) + '\n');
  process.exit(code);
};
const getJSON = (u) => new Promise((resolve, reject) => {
  http.get(u, (r) => { let d = ''; r.on('data', (c) => d += c); r.on('end', () => resolve(JSON.parse(d))); })
    .on('error', reject);
});

(async () => {
  let port = null;
  while (!port && Date.now() < deadline) {
    try { port = fs.readFileSync(path.join(profile, 'DevToolsActivePort'), 'utf8').split('\n')[0]; } catch (e) { await sleep(100); }
  }
  let targets = null;
  while (!targets && Date.now() < deadline) {
    try { targets = await getJSON(`http://127.0.0.1:${port}/json`); } catch (e) { await sleep(100); }
  }
  const page = targets.find((t) => t.type === 'page');
  const ws = new WebSocket(page.webSocketDebuggerUrl);
  const pending = new Map();
  const exceptions = [];
  let id = 0;
  const send = (method, params = {}) => new Promise((resolve) => {
    const i = ++id;
    pending.set(i, resolve);
    ws.send(JSON.stringify({id: i, method, params}));
  });
  ws.onmessage = (ev) => {
    const m = JSON.parse(ev.data);
    if (m.id && pending.has(m.id)) { pending.get(m.id)(m.result); pending.delete(m.id); }
    else if (m.method === 'Runtime.exceptionThrown') exceptions.push(JSON.stringify(m.params.exceptionDetails).slice(0, 500));
  };
  await new Promise((r) => { ws.onopen = r; });
  await send('Runtime.enable');
  await send('Page.enable');
  await send('Page.navigate', {url});
  const text = async () => (await send('Runtime.evaluate', {expression: 'document.body ? document.body.innerText : ""',
                                                            returnByValue: true})).result.value || '';
  let timeline = '';
  let loaded = false;
  while (Date.now() < deadline) {
    timeline = await text();
    if (timeline.includes('Current Trace') && expected.every((s) => timeline.includes(s))) { loaded = true; break; }
    await sleep(500);
  }
  let info = '';
  if (loaded) {
    await send('Runtime.evaluate', {expression: "location.hash = '#!/info'"});
    while (Date.now() < deadline) {
      info = await text();
      if (info.includes('Debugging stats')) break;
      await sleep(300);
    }
  }
  ws.close();
  finish({loaded, timeline_text: timeline, info_text: info, exceptions}, 0);
})().catch((e) => finish({loaded: false, error: String(e && e.stack || e)}, 1));
