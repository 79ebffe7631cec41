// The operator's path through the admin in a real browser: log in, find a sandbox by id,
// open it, follow its "idempotency record" link, check the record page, take a screenshot.
//
// Debian's Chromium (/usr/bin/chromium) driven by playwright-core (pinned in package.json;
// it downloads no browser of its own). Run by tests/browser/test_admin_browser.py, which
// starts the server and passes everything in the environment:
//   BASE_URL, ADMIN_USER, ADMIN_PASSWORD   the live server and its superuser
//   SANDBOX_ID, IDEMPOTENCY_KEY            the keyed sandbox to find and the key it was made with
//   SECRET_TOKEN                           its envdAccessToken: must appear nowhere on the page
//   SCREENSHOT                             where to save the PNG
//   CHROMIUM                               the browser (default /usr/bin/chromium)
// Exits 0 and prints "admin_flow.mjs: ok" when every check passed; otherwise prints the
// step that failed (and still tries to save a screenshot of where it stopped) and exits 1.
import assert from 'node:assert/strict'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { chromium } from 'playwright-core'

const env = (name, fallback) => {
  const value = process.env[name] ?? fallback
  if (!value) {
    console.error(`admin_flow.mjs: set ${name}`)
    process.exit(2)
  }
  return value
}
const base = env('BASE_URL').replace(/\/$/, '')
const user = env('ADMIN_USER')
const password = env('ADMIN_PASSWORD')
const sandboxId = env('SANDBOX_ID')
const key = env('IDEMPOTENCY_KEY')
const secretToken = env('SECRET_TOKEN')
const screenshot = env('SCREENSHOT')
const executablePath = env('CHROMIUM', '/usr/bin/chromium')

// A fresh profile every run: no cookies, cache or session from an earlier one.
const profile = mkdtempSync(join(tmpdir(), 'e2bfacade-chromium-'))
let step = 'launch'
let context

async function main() {
  context = await chromium.launchPersistentContext(profile, {
    executablePath,
    headless: true, // playwright adds --headless itself
    args: [
      '--no-sandbox', // we run as root in CI, where Chromium's own sandbox cannot start
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
    viewport: { width: 1280, height: 900 },
  })
  context.setDefaultTimeout(15_000)
  const page = context.pages()[0] ?? (await context.newPage())

  step = 'log in'
  await page.goto(`${base}/admin/login/?next=/admin/`)
  await page.fill('#id_username', user)
  await page.fill('#id_password', password)
  await Promise.all([page.waitForURL(`${base}/admin/`), page.click('input[type=submit]')])
  assert.match(await page.locator('#site-name').innerText(), /administration/i)

  step = 'find the sandbox by id'
  await page.goto(`${base}/admin/sandboxes/sandbox/`)
  await page.fill('#searchbar', sandboxId)
  await Promise.all([page.waitForURL(/[?&]q=/), page.press('#searchbar', 'Enter')])
  const rows = page.locator('#result_list tbody tr')
  assert.equal(await rows.count(), 1, 'the search should find exactly one sandbox')

  step = 'open the sandbox'
  await Promise.all([
    page.waitForURL(new RegExp(`/admin/sandboxes/sandbox/${sandboxId}/change/`)),
    rows.first().getByRole('link', { name: sandboxId }).click(),
  ])
  const sandboxPage = await page.locator('#content').innerText()
  assert.ok(sandboxPage.includes(sandboxId), 'the sandbox page does not name the sandbox')
  assert.ok(!sandboxPage.includes(secretToken), 'the sandbox page shows its access token')

  step = 'follow the idempotency record link'
  await Promise.all([
    page.waitForURL(/\/admin\/idempotency\/idempotencyrecord\/\d+\/change\//),
    page.click('#idempotency-record-link'),
  ])

  step = 'check the record page'
  const record = await page.locator('#content').innerText()
  assert.ok(record.includes(key), 'the record page does not show its key')
  assert.match(record, /\bcompleted\b/, 'the record is not shown as completed')
  assert.ok(record.includes(sandboxId), 'the record page does not name its sandbox')
  assert.ok(record.includes('"envdAccessToken": "[redacted]"'), 'the token is not redacted')
  assert.ok(!(await page.content()).includes(secretToken), 'the page holds the real token')

  step = 'screenshot'
  await page.screenshot({ path: screenshot, fullPage: true })
  console.log(`admin_flow.mjs: ok (${screenshot})`)
}

try {
  await main()
} catch (error) {
  console.error(`admin_flow.mjs: failed at step "${step}": ${error?.stack ?? error}`)
  try {
    const page = context?.pages()[0]
    if (page) await page.screenshot({ path: screenshot.replace(/\.png$/, '-failed.png'), fullPage: true })
  } catch {}
  process.exitCode = 1
} finally {
  await context?.close().catch(() => {})
  rmSync(profile, { recursive: true, force: true })
}
