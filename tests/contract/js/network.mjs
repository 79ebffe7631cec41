// Networking with the unmodified JS SDK (e2b@2.51.0), against a server whose uplink is the
// test suite's own internet (tests/support/internet.py): a default create reaches it (this
// SDK sends allow_internet_access: true on every create), allowInternetAccess: false and
// network allow/deny lists hold, and updateNetwork changes them live.
// Run by tests/network/test_sdk_network.py; prints "network.mjs: ok" when every step matched.
import assert from 'node:assert/strict'
import { Sandbox, ALL_TRAFFIC } from 'e2b'

const WEB = 'http://203.0.113.10/'
let step = 'create (default)'
const made = []

async function reaches(sandbox, url) {
  try {
    const run = await sandbox.commands.run(`curl -sS --connect-timeout 3 --max-time 8 ${url}`)
    return run.exitCode === 0
  } catch (err) {
    if (err.exitCode !== undefined) return false // CommandExitError: refused
    throw err
  }
}

async function main() {
  const open = await Sandbox.create('base', { timeoutMs: 120_000 })
  made.push(open)
  assert.equal(await reaches(open, WEB), true)

  step = 'allowInternetAccess: false'
  const closed = await Sandbox.create('base', { timeoutMs: 120_000, allowInternetAccess: false })
  made.push(closed)
  assert.equal(await reaches(closed, WEB), false)

  step = 'network allow/deny'
  const listed = await Sandbox.create('base', {
    timeoutMs: 120_000,
    network: { denyOut: [ALL_TRAFFIC], allowOut: ['1.1.1.1'] },
  })
  made.push(listed)
  assert.equal(await reaches(listed, 'http://1.1.1.1/'), true)
  assert.equal(await reaches(listed, 'http://8.8.8.8/'), false)

  step = 'updateNetwork'
  if (typeof listed.updateNetwork === 'function') {
    await listed.updateNetwork({})
    assert.equal(await reaches(listed, 'http://8.8.8.8/'), true)
  } else {
    console.log('network.mjs: this SDK version has no updateNetwork')
  }

  for (const sandbox of made) await sandbox.kill()
  console.log('network.mjs: ok')
}

main().catch(async (err) => {
  console.error(`network.mjs: failed at ${step}:`, err)
  for (const sandbox of made) await sandbox.kill().catch(() => {})
  process.exit(1)
})
