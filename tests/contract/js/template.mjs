// A Template SDK v2 build with the unmodified E2B JS SDK (e2b@2.51.0, pinned in package.json).
//
// The JS SDK differs from the Python one on the wire: it sends its JSON bodies chunked and
// uploads every COPY archive at once (Promise.all), so the three copy() calls below are
// three concurrent PUTs. Then: runCmd, setEnvs, setStartCmd with waitForFile, a build
// named 'name:v1', a sandbox of it (files, env, the start command's effect), a failing
// runCmd rejecting with the step's message, and tags (assign, get, a sandbox by tag, remove).
//
// Reads E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY from the environment, like any SDK
// user; TPL_NAME names the template (unique per run). Prints "template.mjs: ok" when every
// check held. Run by tests/contract/test_js_templates.py.
import assert from 'node:assert/strict'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { BuildError, Sandbox, Template, waitForFile } from 'e2b'

for (const name of ['E2B_API_URL', 'E2B_API_KEY', 'TPL_NAME']) {
  if (!process.env[name]) {
    console.error(`template.mjs: set ${name}`)
    process.exit(2)
  }
}
if (process.env.E2B_DEBUG) {
  console.error('template.mjs: unset E2B_DEBUG, in debug mode the SDK skips the API')
  process.exit(2)
}

const name = process.env.TPL_NAME
let step = 'start'
const sandboxes = []

function context() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'js-tpl-'))
  fs.mkdirSync(path.join(dir, 'folder'))
  fs.writeFileSync(path.join(dir, 'folder', 'a.txt'), 'alpha\n')
  fs.writeFileSync(path.join(dir, 'folder', 'b.txt'), 'beta\n')
  fs.writeFileSync(path.join(dir, 'one.txt'), 'one\n')
  fs.writeFileSync(path.join(dir, 'two.txt'), `two ${name}\n`)
  return dir
}

async function main() {
  const dir = context()
  const logs = []
  step = 'build'
  const template = Template({ fileContextPath: dir })
    .fromTemplate('base')
    .copy('folder/*', 'folder')
    .copy('one.txt', '/home/user/one.txt')
    .copy('two.txt', 'copied/two.txt')
    .runCmd('cat folder/a.txt folder/b.txt one.txt copied/two.txt > all.txt')
    .setEnvs({ GREETING: 'hello from js', WHERE: '$HOME/here' })
    .setStartCmd('echo started > /tmp/started && sleep 600', waitForFile('/tmp/started'))
  const info = await Template.build(template, `${name}:v1`, {
    cpuCount: 1,
    memoryMB: 1024,
    onBuildLogs: (entry) => logs.push(String(entry)),
  })
  assert.ok(info.templateId, 'build returned no templateId')
  assert.ok(info.buildId, 'build returned no buildId')
  assert.ok(
    logs.some((line) => line.includes('COPY')),
    `no COPY step in the build logs:\n${logs.join('\n')}`,
  )

  step = 'sandbox of the build'
  const sandbox = await Sandbox.create(`${name}:v1`, { timeoutMs: 120_000 })
  sandboxes.push(sandbox)
  assert.equal(await sandbox.files.read('/home/user/folder/a.txt'), 'alpha\n')
  assert.equal(await sandbox.files.read('/home/user/folder/b.txt'), 'beta\n')
  assert.equal(await sandbox.files.read('/home/user/one.txt'), 'one\n')
  assert.equal(await sandbox.files.read('/home/user/copied/two.txt'), `two ${name}\n`)
  assert.equal(
    await sandbox.files.read('/home/user/all.txt'),
    `alpha\nbeta\none\ntwo ${name}\n`,
  )
  // E2B expands an ENV value as root (its evaluateValue), so $HOME is root's home.
  const env = await sandbox.commands.run('echo "$GREETING|$WHERE"; whoami; pwd')
  assert.equal(env.stdout, 'hello from js|/root/here\nuser\n/home/user\n')
  const started = await sandbox.commands.run('cat /tmp/started')
  assert.equal(started.stdout, 'started\n')

  step = 'failing runCmd'
  const bad = Template().fromTemplate('base').runCmd('echo fine').runCmd('exit 3')
  await assert.rejects(
    Template.build(bad, `${name}-bad`, { cpuCount: 1, memoryMB: 1024 }),
    (err) => {
      assert.ok(err instanceof BuildError, `not a BuildError: ${err}`)
      assert.equal(err.message, "failed to run command 'exit 3': exit status 3")
      return true
    },
  )

  step = 'tags'
  const assigned = await Template.assignTags(`${name}:v1`, ['production', 'latest'])
  assert.equal(assigned.buildId, info.buildId)
  assert.deepEqual([...assigned.tags].sort(), ['latest', 'production'])
  const tags = await Template.getTags(name)
  const byTag = Object.fromEntries(tags.map((t) => [t.tag, t.buildId]))
  for (const tag of ['v1', 'production', 'latest']) {
    assert.equal(byTag[tag], info.buildId, `tag ${tag}: ${JSON.stringify(tags)}`)
  }
  assert.ok(tags.every((t) => t.createdAt instanceof Date), 'createdAt is not a Date')
  const tagged = await Sandbox.create(`${name}:production`, { timeoutMs: 120_000 })
  sandboxes.push(tagged)
  assert.equal(await tagged.files.read('/home/user/one.txt'), 'one\n')
  await Template.removeTags(name, 'latest')
  const left = (await Template.getTags(name)).map((t) => t.tag).sort()
  assert.ok(!left.includes('latest'), `latest was not removed: ${left}`)
  assert.ok(left.includes('production'), `production went with latest: ${left}`)
  assert.equal(await Template.exists(name), true)
  assert.equal(await Template.exists(`${name}-never-built`), false)
}

try {
  await main()
  console.log('template.mjs: ok')
} catch (err) {
  console.error(`template.mjs: step '${step}' failed:`, err)
  process.exitCode = 1
} finally {
  for (const sandbox of sandboxes) {
    try {
      await sandbox.kill()
    } catch (err) {
      console.error(`template.mjs: kill ${sandbox.sandboxId}:`, err)
    }
  }
}
