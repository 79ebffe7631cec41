// E2B's volumes with the unmodified E2B JS SDK (e2b@2.51.0): Volume.create, the content
// calls on the data plane (E2B_VOLUME_API_URL, as scripts/serve.sh prints it), a streamed
// upload (a ReadableStream body, sent chunked in half-duplex), a wrong token, and a sandbox
// that mounts the volume and reads what the SDK wrote (and writes what the SDK reads back).
//
// Reads E2B_API_URL, E2B_SANDBOX_URL, E2B_VOLUME_API_URL and E2B_API_KEY from the
// environment; prints "volumes.mjs: ok" when every step matched. Run by
// tests/contract/test_js_volumes.py. VOLUME_MOUNTS=0 skips the sandbox part (and says so).
import assert from 'node:assert/strict'
import { createHash } from 'node:crypto'
import { AuthenticationError, Sandbox, Volume, VolumeError, VolumePathNotFoundError } from 'e2b'

for (const name of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_VOLUME_API_URL', 'E2B_API_KEY']) {
  if (!process.env[name]) {
    console.error(`volumes.mjs: set ${name}`)
    process.exit(2)
  }
}

let step = 'start'
let volumeId
let sandbox

async function rejects(promise, cls, what) {
  try {
    await promise
  } catch (err) {
    assert.ok(err instanceof cls, `${what}: ${err?.constructor?.name}: ${err?.message}`)
    return err
  }
  assert.fail(`${what}: did not throw`)
}

async function main() {
  step = 'Volume.create'
  const name = `js-vol-${process.pid}-${Date.now()}`
  const vol = await Volume.create(name)
  volumeId = vol.volumeId
  assert.equal(vol.name, name)
  assert.ok(vol.token, 'create gave no token')

  step = 'writeFile / readFile'
  const entry = await vol.writeFile('/notes/hello.txt', 'hello from js', { force: true })
  assert.equal(entry.name, 'hello.txt')
  assert.equal(entry.path, '/notes/hello.txt')
  assert.equal(entry.type, 'file')
  assert.equal(entry.size, 13)
  assert.ok(entry.mtime instanceof Date && Math.abs(entry.mtime - Date.now()) < 120_000)
  assert.equal(await vol.readFile('/notes/hello.txt'), 'hello from js')
  assert.deepEqual(
    Buffer.from(await vol.readFile('/notes/hello.txt', { format: 'bytes' })),
    Buffer.from('hello from js'),
  )
  await rejects(vol.writeFile('/notes/hello.txt', 'again'), VolumeError, 'write without force')
  await rejects(vol.readFile('/notes/none'), VolumePathNotFoundError, 'read of a missing file')

  step = 'a streamed upload and download'
  const chunk = Buffer.alloc(1 << 20, 7)
  let sent = 0
  const body = new ReadableStream({
    pull(controller) {
      if (sent === 8) return controller.close()
      sent += 1
      controller.enqueue(new Uint8Array(chunk))
    },
  })
  const big = await vol.writeFile('/big.bin', body, { mode: 0o600, uid: 1000, gid: 1000 })
  assert.equal(big.size, 8 << 20)
  assert.equal(big.mode, 0o600)
  assert.equal(big.uid, 1000)
  const stream = await vol.readFile('/big.bin', { format: 'stream' })
  const hash = createHash('sha256')
  let got = 0
  for await (const part of stream) {
    hash.update(part)
    got += part.length
  }
  assert.equal(got, 8 << 20)
  const want = createHash('sha256')
  for (let i = 0; i < 8; i++) want.update(chunk)
  assert.equal(hash.digest('hex'), want.digest('hex'))

  step = 'list / makeDir / getInfo / exists / updateMetadata'
  const dir = await vol.makeDir('/a/b', { force: true })
  assert.equal(dir.type, 'directory')
  assert.deepEqual((await vol.list('/')).map((e) => e.path), ['/a', '/big.bin', '/notes'])
  assert.deepEqual((await vol.list('/a', { depth: 2 })).map((e) => e.path), ['/a/b'])
  assert.equal((await vol.getInfo('/notes')).type, 'directory')
  assert.equal(await vol.exists('/notes/hello.txt'), true)
  assert.equal(await vol.exists('/notes/none'), false)
  const updated = await vol.updateMetadata('/notes/hello.txt', { uid: 1000, gid: 1000, mode: 0o664 })
  assert.equal(updated.uid, 1000)
  assert.equal(updated.mode, 0o664)

  step = 'a wrong token'
  const stranger = await Volume.create(`${name}-other`)
  try {
    await rejects(
      vol.readFile('/notes/hello.txt', { token: stranger.token }),
      AuthenticationError,
      "another volume's token",
    )
  } finally {
    await Volume.destroy(stranger.volumeId)
  }

  if (process.env.VOLUME_MOUNTS !== '0') {
    step = 'a sandbox that mounts it'
    sandbox = await Sandbox.create('base', { volumeMounts: { '/mnt/data': vol }, timeoutMs: 120_000 })
    assert.equal(await sandbox.files.read('/mnt/data/notes/hello.txt'), 'hello from js')
    const run = await sandbox.commands.run('sha256sum /mnt/data/big.bin && id -u')
    assert.ok(run.stdout.includes(createHash('sha256').update(Buffer.concat(Array(8).fill(chunk))).digest('hex')))
    await sandbox.commands.run('echo "from the sandbox" > /mnt/data/notes/back.txt')
    assert.equal(await vol.readFile('/notes/back.txt'), 'from the sandbox\n')
    const back = await vol.getInfo('/notes/back.txt')
    assert.equal(back.uid, 1000, 'what the sandbox\'s user wrote is owned by guest id 1000')
    await sandbox.kill()
    sandbox = undefined
  } else {
    console.log('volumes.mjs: the sandbox part was not run (VOLUME_MOUNTS=0)')
  }

  step = 'remove / destroy'
  await vol.remove('/notes')
  assert.equal(await vol.exists('/notes'), false)
  await rejects(vol.remove('/notes'), VolumePathNotFoundError, 'remove of a missing path')
  assert.equal(await Volume.destroy(volumeId), true)
  volumeId = undefined
}

try {
  await main()
  console.log('volumes.mjs: ok')
} catch (err) {
  console.error(`volumes.mjs: step "${step}" failed:`, err)
  process.exitCode = 1
} finally {
  if (sandbox) await sandbox.kill().catch(() => {})
  if (volumeId) await Volume.destroy(volumeId).catch(() => {})
}
