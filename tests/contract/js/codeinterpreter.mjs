// The Code Interpreter quickstart with the unmodified @e2b/code-interpreter SDK (pinned in
// package.json) against e2bfacade: E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY as
// scripts/serve.sh prints them. Run by tests/codeinterpreter/test_js_sdk.py; prints
// "codeinterpreter.mjs: ok" when every check passed.
import assert from 'node:assert/strict'
import { Sandbox } from '@e2b/code-interpreter'

const sbx = await Sandbox.create({ timeoutMs: 120_000 })
try {
  // State kept across calls.
  await sbx.runCode('x = 40')
  const sum = await sbx.runCode('x + 2')
  assert.equal(sum.text, '42')

  // A figure as PNG (and its chart), a DataFrame as HTML.
  const plot = await sbx.runCode(
    "import matplotlib.pyplot as plt\nplt.bar(['a', 'b'], [3, 5])\nplt.title('bars')\nplt.show()"
  )
  assert.equal(plot.results.length, 1)
  assert.ok(Buffer.from(plot.results[0].png, 'base64').subarray(0, 4).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47])))
  assert.equal(plot.results[0].chart.title, 'bars')
  const frame = await sbx.runCode("import pandas as pd\npd.DataFrame({'n': [1, 2]})")
  assert.match(frame.results[0].html, /<table/)

  // An exception as the execution's error.
  const failed = await sbx.runCode('1 / 0')
  assert.equal(failed.error.name, 'ZeroDivisionError')
  assert.match(failed.error.traceback, /1 \/ 0/)

  // Streaming callbacks, in order.
  const seen = []
  await sbx.runCode(
    "import sys, time\nprint('out', flush=True)\ntime.sleep(0.5)\nprint('err', file=sys.stderr, flush=True)\n7",
    {
      onStdout: (m) => seen.push(`stdout:${m.line}`),
      onStderr: (m) => seen.push(`stderr:${m.line}`),
      onResult: (r) => seen.push(`result:${r.text}`),
    }
  )
  assert.deepEqual(seen, ['stdout:out\n', 'stderr:err\n', 'result:7'])

  // Contexts and languages.
  const ctx = await sbx.createCodeContext({ cwd: '/tmp' })
  assert.equal((await sbx.runCode('import os; os.getcwd()', { context: ctx })).text, '/tmp')
  const contexts = await sbx.listCodeContexts()
  assert.ok(contexts.some((c) => c.id === ctx.id))
  await sbx.removeCodeContext(ctx)
  const bash = await sbx.runCode('echo $((6 * 7))', { language: 'bash' })
  assert.deepEqual(bash.logs.stdout, ['42\n'])

  // JavaScript and TypeScript cells.
  await sbx.runCode('const n = 20', { language: 'js' })
  assert.equal((await sbx.runCode('n * 2 + 2', { language: 'js' })).text, '42')
  assert.equal((await sbx.runCode("const s: string = 'typed'; s", { language: 'ts' })).text, 'typed')

  // A timeout interrupts the kernel; the next call runs at once, in the same kernel.
  await assert.rejects(sbx.runCode('import time\nwhile True: time.sleep(0.1)', { timeoutMs: 1000 }))
  assert.equal((await sbx.runCode('x')).text, '40')

  // Env vars per call.
  const env = await sbx.runCode("import os; os.environ['ONLY_NOW']", { envs: { ONLY_NOW: 'yes' } })
  assert.equal(env.text, 'yes')
} finally {
  await sbx.kill()
}
console.log('codeinterpreter.mjs: ok')
