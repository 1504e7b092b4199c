// lib.mjs — helpers shared by the server tests: start `kiln serve` on a free port, wait for it,
// stop it with SIGTERM (asserting a clean exit 0), small assert/HTTP/SSE utilities.
import { spawn } from "node:child_process";
import { createRequire } from "node:module";
import * as fs from "node:fs";

export const BIN = process.env.KILN_BIN;
export const SHARED = process.env.KILN_SHARED || "../shared";
export const DEMO = process.env.KILN_TEST_MODEL ||
  (process.env.KILN_SOURCE && fs.existsSync(process.env.KILN_SOURCE + "/models/demo-q8/config.json")
    ? process.env.KILN_SOURCE + "/models/demo-q8" : SHARED + "/models/demo-bf16");

// Packages installed by the test script into $KILN_NPM (a gitignored folder under the build dir).
export function npm(name) {
  return createRequire(process.env.KILN_NPM + "/package.json")(name);
}

let failures = 0;
export function check(cond, what, detail) {
  if (cond) { console.log("ok   " + what); return true; }
  failures++;
  console.log("FAIL " + what + (detail !== undefined ? " :: " + (typeof detail === "string" ? detail : JSON.stringify(detail)).slice(0, 600) : ""));
  return false;
}
export function eq(a, b, what) { return check(JSON.stringify(a) === JSON.stringify(b), what, { got: a, want: b }); }
export function failed() { return failures; }

export async function startServer(args, { env } = {}) {
  const extra = (process.env.KILN_SERVE_EXTRA || "").split(/\s+/).filter(Boolean); // e.g. "--kv q8"
  const child = spawn(BIN, ["serve", "--port", "0", "--quiet", ...args, ...extra], { stdio: ["ignore", "ignore", "pipe"], env: { ...process.env, ...env } });
  let log = "";
  const url = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("server did not start in 120 s:\n" + log)), 120000);
    child.stderr.on("data", d => {
      log += d;
      const m = /listening on (http:\/\/[\d.]+:\d+)/.exec(log);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
    child.on("exit", code => { clearTimeout(timer); reject(new Error("server exited with " + code + ":\n" + log)); });
  });
  child.stderr.on("data", d => { log += d; });
  return {
    url, child, log: () => log,
    async stop() {
      if (child.exitCode !== null) return child.exitCode;
      const code = await new Promise(resolve => { child.once("exit", (c, sig) => resolve(c === null ? sig : c)); child.kill("SIGTERM"); setTimeout(() => child.kill("SIGKILL"), 30000); });
      return code;
    },
  };
}

export async function post(url, body, headers = {}) {
  const r = await fetch(url, { method: "POST", headers: { "content-type": "application/json", ...headers }, body: typeof body === "string" ? body : JSON.stringify(body) });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch {}
  return { status: r.status, json, text, headers: r.headers };
}

export async function getJSON(url, headers = {}) {
  const r = await fetch(url, { headers });
  return { status: r.status, json: await r.json().catch(() => null) };
}

// Reads an SSE response into [{event, data}] (data parsed as JSON when possible).
export async function sse(url, body, { headers = {}, signal } = {}) {
  const r = await fetch(url, { method: "POST", headers: { "content-type": "application/json", ...headers }, body: JSON.stringify(body), signal });
  const text = await r.text();
  const events = [];
  for (const block of text.split("\n\n")) {
    if (!block.trim()) continue;
    let event = null, data = "";
    for (const line of block.split("\n")) {
      if (line.startsWith("event: ")) event = line.slice(7);
      else if (line.startsWith("data: ")) data += line.slice(6);
    }
    let parsed = data;
    try { parsed = JSON.parse(data); } catch {}
    events.push({ event, data: parsed });
  }
  return { status: r.status, events, text };
}

export async function waitIdle(url, ms = 10000, headers = {}) {
  const t0 = Date.now();
  let s;
  while (Date.now() - t0 < ms) {
    s = (await getJSON(url + "/stats", headers)).json;
    if (s.requests.running === 0 && s.requests.waiting === 0) return s;
    await new Promise(r => setTimeout(r, 100));
  }
  return s;
}

export function finish(server) {
  return server.stop().then(code => {
    eq(code, 0, "server exits 0 on SIGTERM");
    if (failed()) { console.log(failed() + " check(s) failed"); process.exit(1); }
    console.log("all checks passed");
  });
}
