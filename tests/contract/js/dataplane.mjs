// The E2B quickstart's data-plane calls with the unmodified JS SDK (e2b@2.51.0): commands,
// files, a background command and its kill, a terminal, isRunning before and after kill.
// Reads E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY, the exports scripts/serve.sh prints.
// Run by tests/contract/test_js_sdk.py. Exits 0 and prints "dataplane.mjs: ok" when every
// step matched.
import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'

let step = 'create'
let sandbox

async function main() {
  sandbox = await Sandbox.create('base', { timeoutMs: 120_000 })

  step = 'commands.run'
  const run = await sandbox.commands.run('echo "hi $(whoami)"; echo err >&2')
  assert.equal(run.exitCode, 0)
  assert.equal(run.stdout, 'hi user\n')
  assert.equal(run.stderr, 'err\n')

  step = 'commands.run as root'
  assert.equal((await sandbox.commands.run('whoami', { user: 'root' })).stdout, 'root\n')

  step = 'files.write/read/list'
  await sandbox.files.write('/home/user/js/hello.txt', 'hello from js')
  assert.equal(await sandbox.files.read('/home/user/js/hello.txt'), 'hello from js')
  const entries = await sandbox.files.list('/home/user/js')
  assert.deepEqual(entries.map((e) => e.name), ['hello.txt'])
  assert.equal(await sandbox.files.exists('/home/user/js/nope'), false)

  step = 'background + kill'
  const bg = await sandbox.commands.run('sleep 60', { background: true })
  const listed = await sandbox.commands.list()
  assert.ok(listed.some((p) => p.pid === bg.pid), 'background command not listed')
  assert.equal(await sandbox.commands.kill(bg.pid), true)

  step = 'pty'
  let seen = ''
  const decoder = new TextDecoder()
  const terminal = await sandbox.pty.create({
    cols: 80,
    rows: 24,
    onData: (data) => {
      seen += decoder.decode(data)
    },
  })
  await sandbox.pty.sendInput(terminal.pid, new TextEncoder().encode('stty size; exit\n'))
  await terminal.wait()
  assert.match(seen, /24 80/)

  step = 'watchDir'
  await sandbox.files.makeDir('/home/user/watched')
  const changes = []
  const watcher = await sandbox.files.watchDir('/home/user/watched', (event) => changes.push(event))
  await sandbox.files.write('/home/user/watched/new.txt', 'x')
  for (let i = 0; i < 50 && !changes.some((e) => e.name === 'new.txt'); i++) {
    await new Promise((resolve) => setTimeout(resolve, 100))
  }
  await watcher.stop()
  assert.ok(changes.some((e) => e.name === 'new.txt' && e.type === 'create'), JSON.stringify(changes))

  step = 'isRunning'
  assert.equal(await sandbox.isRunning(), true)
  await sandbox.kill()
  assert.equal(await sandbox.isRunning(), false)
  console.log('dataplane.mjs: ok')
}

main().catch(async (error) => {
  console.error(`dataplane.mjs: step "${step}" failed:`, error)
  if (sandbox) await sandbox.kill().catch(() => {})
  process.exit(1)
})
