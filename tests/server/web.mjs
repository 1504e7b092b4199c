// web.mjs — the chat page at / in headless Chromium (playwright-core): type a message, click Send,
// wait for the streamed reply, and check it equals the API's greedy reply to the same conversation.
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { startServer, post, check, eq, finish, npm, DEMO } from "./lib.mjs";

const { chromium } = npm("playwright-core");
const srv = await startServer(["--model", DEMO, "--ctx", "1024"]);
const userDir = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-chromium-"));
// a fresh --user-data-dir (playwright passes it for a persistent context)
const browser = await chromium.launchPersistentContext(userDir, {
  executablePath: process.env.KILN_CHROMIUM || "/usr/bin/chromium", headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run"],
});
try {
  const page = await browser.newPage();
  const resp = await page.goto(srv.url + "/");
  eq(resp.status(), 200, "GET / serves the page");
  eq(await page.title(), "kiln chat", "page title");
  await page.fill("#max", "16");
  await page.fill("#temp", "0");
  await page.fill("#input", "def main():");
  await page.click("#send");
  const bubble = page.locator(".msg.assistant").last();
  await page.waitForFunction(() => { const b = [...document.querySelectorAll(".msg.assistant, .msg.error")].pop(); return b && b.dataset.state && b.dataset.state !== "streaming"; }, null, { timeout: 120000 });
  eq(await bubble.getAttribute("data-state"), "done", "reply finished streaming");
  const shown = await bubble.textContent();
  const api = await post(srv.url + "/v1/chat/completions", { messages: [{ role: "user", content: "def main():" }], max_tokens: 16, temperature: 0 });
  check(shown.length > 0, "page shows a non-empty reply", shown);
  eq(shown, api.json.choices[0].message.content, "page reply equals the API's greedy reply");
  eq(await page.locator(".msg.user").textContent(), "def main():", "user bubble shows the message");
  // second turn: the page sends the whole history
  await page.fill("#input", "again");
  await page.click("#send");
  await page.waitForFunction(() => document.querySelectorAll(".msg.assistant").length === 2 && document.querySelectorAll(".msg.assistant")[1].dataset.state === "done", null, { timeout: 120000 });
  const stats = await fetch(srv.url + "/stats").then(r => r.json());
  check(stats.prefix_cache.cached_tokens > 0, "second turn reused the first turn's cache", stats.prefix_cache);
} finally {
  await browser.close();
  fs.rmSync(userDir, { recursive: true, force: true });
}
await finish(srv);
