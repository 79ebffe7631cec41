// Smoke test of e2bfacade with the unmodified E2B JS SDK (e2b@2.51.0, pinned in package.json).
//
// Reads E2B_API_URL and E2B_API_KEY from the environment, like any SDK user. E2B_DEBUG must
// stay unset: in debug mode the SDK makes no API call for create, connect or kill.
// Exits 0 when every step matched; otherwise prints what mismatched and exits 1.
// Run by tests/contract/test_js_sdk.py; by hand: `E2B_API_URL=... E2B_API_KEY=... node smoke.mjs`.
import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'

if (!process.env.E2B_API_URL || !process.env.E2B_API_KEY) {
  console.error('smoke.mjs: set E2B_API_URL and E2B_API_KEY')
  process.exit(2)
}
if (process.env.E2B_DEBUG) {
  console.error('smoke.mjs: unset E2B_DEBUG, in debug mode the SDK skips the API')
  process.exit(2)
}

const tag = `js-smoke-${process.pid}-${Date.now()}`
let step = 'start'
let sandboxId

async function main() {
  step = 'create'
  const sandbox = await Sandbox.create('base', { timeoutMs: 120_000, metadata: { tag } })
  sandboxId = sandbox.sandboxId
  assert.ok(sandboxId, 'create returned no sandboxId')

  step = 'getInfo'
  const info = await sandbox.getInfo()
  assert.equal(info.sandboxId, sandboxId)
  assert.equal(info.templateId, 'base')
  assert.equal(info.state, 'running')
  assert.deepEqual(info.metadata, { tag })
  assert.ok(info.startedAt instanceof Date && info.endAt instanceof Date, 'dates are not Dates')
  const lifetime = (info.endAt - info.startedAt) / 1000
  assert.ok(Math.abs(lifetime - 120) < 2, `endAt - startedAt is ${lifetime}s, want 120s`)

  step = 'list'
  const paginator = Sandbox.list({ query: { metadata: { tag }, state: ['running', 'paused'] }, limit: 1 })
  const listed = []
  while (paginator.hasNext) listed.push(...(await paginator.nextItems()))
  assert.deepEqual(listed.map((s) => s.sandboxId), [sandboxId])
  assert.equal(listed[0].state, 'running')
  assert.deepEqual(listed[0].metadata, { tag })

  step = 'pause'
  assert.equal(await sandbox.pause(), true, 'first pause should answer true')
  assert.equal(await Sandbox.pause(sandboxId), false, 'pausing a paused sandbox should answer false')
  assert.equal((await Sandbox.getInfo(sandboxId)).state, 'paused')
  const pausedList = Sandbox.list({ query: { metadata: { tag }, state: ['paused'] } })
  assert.deepEqual((await pausedList.nextItems()).map((s) => s.sandboxId), [sandboxId])

  step = 'connect (resume)'
  const resumed = await Sandbox.connect(sandboxId, { timeoutMs: 60_000 })
  assert.equal(resumed.sandboxId, sandboxId)
  assert.equal((await resumed.getInfo()).state, 'running')

  step = 'kill'
  assert.equal(await resumed.kill(), true, 'first kill should answer true')
  assert.equal(await Sandbox.kill(sandboxId), false, 'killing a killed sandbox should answer false')
  await assert.rejects(Sandbox.getInfo(sandboxId), (err) => {
    assert.match(err.name, /NotFound/, `getInfo after kill threw ${err.name}: ${err.message}`)
    return true
  })
  sandboxId = undefined
}

try {
  await main()
  console.log('smoke.mjs: ok')
} catch (err) {
  console.error(`smoke.mjs: step "${step}" failed: ${err?.stack ?? err}`)
  if (sandboxId) await Sandbox.kill(sandboxId).catch(() => {})
  process.exit(1)
}
