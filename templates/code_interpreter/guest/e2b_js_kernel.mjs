// The JavaScript and TypeScript kernel of code-interpreter-v1: one Node.js process per
// context, driven by the execution service (e2b_execution_server.py) over two pipes.
//
// Requests arrive on stdin, one JSON object per line:
//   {"id": n, "code": "...", "language": "javascript" | "typescript"}  run a cell
//   {"id": n, "env": {"NAME": "value" | null}}                          change process.env
// Events leave on the pipe $E2B_EVENTS_FD, one JSON object per line, each with the
// request's id:
//   {"type": "stdout" | "stderr", "text"}, {"type": "result", "text"},
//   {"type": "error", "name", "value", "traceback"}, then {"type": "done"}.
//
// A cell is plain JavaScript or TypeScript as a notebook expects it: its top-level
// declarations outlive it (they become globals: `const x = 1` in one cell, `x` in the
// next), its last expression is its result, `await` works at top level, and `import`s of
// Node's modules and of packages work (the TypeScript compiler turns a cell into CommonJS;
// TypeScript's types are erased, not checked).
import fs from 'node:fs'
import { createRequire } from 'node:module'
import path from 'node:path'
import readline from 'node:readline'
import util from 'node:util'
import vm from 'node:vm'

const here = path.dirname(new URL(import.meta.url).pathname)
const ts = createRequire(path.join(here, '..', 'node', 'package.json'))('typescript')
const EVENTS = Number(process.env.E2B_EVENTS_FD)
delete process.env.E2B_EVENTS_FD
// SIGINT (the client hung up, the execution service interrupts): a running script stops
// (vm's breakOnSigint), an awaited cell is abandoned; the kernel and its globals stay.
let interrupt = null
process.on('SIGINT', () => {
  if (interrupt) interrupt(Object.assign(new Error('Execution interrupted'), { name: 'KeyboardInterrupt' }))
})
let current = null // the id of the request being run: output belongs to it

function emit(event) {
  fs.writeSync(EVENTS, JSON.stringify({ id: current, ...event }) + '\n')
}

// Everything the cell writes through process.stdout / stderr (console.* included).
for (const [name, stream] of [['stdout', process.stdout], ['stderr', process.stderr]]) {
  stream.write = (chunk, encoding, callback) => {
    const text = typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString(encoding === 'buffer' ? 'utf8' : encoding || 'utf8')
    if (text) emit({ type: name, text })
    if (typeof encoding === 'function') encoding()
    else if (typeof callback === 'function') callback()
    return true
  }
}

// What a cell sees as its module scope: require from its working directory, exports.
globalThis.require = createRequire(path.join(process.cwd(), 'cell.js'))
globalThis.module = { exports: {} }
globalThis.exports = globalThis.module.exports

function transpile(code) {
  return ts.transpileModule(code, {
    reportDiagnostics: false,
    compilerOptions: {
      module: ts.ModuleKind.CommonJS,
      target: ts.ScriptTarget.ES2022,
      esModuleInterop: true,
      // Keep a cell's last expression where it is: no "use strict" prologue to shift it.
      alwaysStrict: false,
      noImplicitUseStrict: true,
    },
  }).outputText
}

function hasTopLevelAwait(source) {
  let found = false
  const visit = (node) => {
    if (found) return
    if (ts.isFunctionLike(node) || ts.isClassLike(node)) return
    if (node.kind === ts.SyntaxKind.AwaitExpression || (ts.isForOfStatement(node) && node.awaitModifier)) {
      found = true
      return
    }
    ts.forEachChild(node, visit)
  }
  ts.forEachChild(source, visit)
  return found
}

function boundNames(name, out) {
  if (ts.isIdentifier(name)) out.push(name.text)
  else for (const element of name.elements) if (!ts.isOmittedExpression(element)) boundNames(element.name, out)
}

// The cell as a script: declarations made global, and (with top-level await) the body in
// an async function whose value is the last expression's.
function rewrite(js) {
  const source = ts.createSourceFile('cell.js', js, ts.ScriptTarget.ES2022, true, ts.ScriptKind.JS)
  const asynchronous = hasTopLevelAwait(source)
  const edits = [] // [start, end, text], applied back to front
  const hoisted = []
  const statements = source.statements
  for (const statement of statements) {
    if (ts.isVariableStatement(statement)) {
      const list = statement.declarationList
      const keywordStart = list.getStart(source)
      const keywordEnd = list.declarations.length ? list.declarations[0].getStart(source) : keywordStart
      if (!asynchronous) {
        edits.push([keywordStart, keywordEnd, 'var '])
        continue
      }
      for (const declaration of list.declarations) boundNames(declaration.name, hoisted)
      const destructuring = list.declarations.some((d) => !ts.isIdentifier(d.name))
      edits.push([keywordStart, keywordEnd, destructuring ? ';(' : ''])
      if (destructuring) edits.push([statement.getEnd() - (js[statement.getEnd() - 1] === ';' ? 1 : 0), statement.getEnd() - (js[statement.getEnd() - 1] === ';' ? 1 : 0), ')'])
      list.declarations.forEach((d) => {
        if (!d.initializer) edits.push([d.getStart(source), d.getEnd(), `${d.getText(source)} = undefined`])
      })
    } else if (ts.isClassDeclaration(statement) && statement.name) {
      // A class becomes a global binding that a later cell may declare again.
      const name = statement.name.text
      if (asynchronous) hoisted.push(name)
      edits.push([statement.getStart(source), statement.getStart(source), `${asynchronous ? '' : 'var '}${name} = `])
    } else if (asynchronous && ts.isFunctionDeclaration(statement) && statement.name) {
      hoisted.push(statement.name.text)
      edits.push([statement.getStart(source), statement.getStart(source), `${statement.name.text} = `])
    }
  }
  const last = statements[statements.length - 1]
  if (asynchronous && last && ts.isExpressionStatement(last)) {
    edits.push([last.getStart(source), last.getStart(source), 'return ('])
    const end = last.getEnd() - (js[last.getEnd() - 1] === ';' ? 1 : 0)
    edits.push([end, end, ')'])
  }
  edits.sort((a, b) => b[0] - a[0] || b[1] - a[1])
  let out = js
  for (const [start, end, text] of edits) out = out.slice(0, start) + text + out.slice(end)
  if (!asynchronous) return { script: out, asynchronous }
  const names = [...new Set(hoisted)]
  return {
    script: `${names.length ? `var ${names.join(', ')};\n` : ''}(async () => {\n${out}\n})()`,
    asynchronous,
  }
}

function show(value) {
  return util.inspect(value, { depth: 6, maxArrayLength: 200, breakLength: 100 })
}

async function runCell(code) {
  const { script, asynchronous } = rewrite(transpile(code))
  let value = vm.runInThisContext(script, { filename: 'cell.js', displayErrors: false, breakOnSigint: true })
  if (asynchronous) {
    value = await Promise.race([value, new Promise((_, reject) => { interrupt = reject })])
  }
  if (value !== undefined) emit({ type: 'result', text: show(value) })
}

// A stack without this kernel's own frames (the cell's come first).
function cellStack(stack) {
  const lines = String(stack).split('\n')
  const ours = lines.findIndex((line) => /node:vm|e2b_js_kernel\.mjs|node:internal/.test(line))
  return (ours > 0 ? lines.slice(0, ours) : lines).join('\n')
}

function reportError(error) {
  if (error instanceof Error || (error && typeof error === 'object' && 'stack' in error)) {
    emit({ type: 'error', name: error.name || 'Error', value: String(error.message ?? ''), traceback: cellStack(error.stack ?? error) })
  } else {
    emit({ type: 'error', name: 'Error', value: show(error), traceback: `Uncaught ${show(error)}` })
  }
}

// A promise rejected after its cell ended belongs to the cell running then, if any.
process.on('unhandledRejection', (error) => reportError(error))
process.on('uncaughtException', (error) => reportError(error))

const requests = readline.createInterface({ input: process.stdin, terminal: false })
let queue = Promise.resolve()
requests.on('line', (line) => {
  queue = queue.then(async () => {
    let request
    try {
      request = JSON.parse(line)
    } catch {
      return
    }
    current = request.id
    try {
      if (request.env) {
        for (const [name, value] of Object.entries(request.env)) {
          if (value === null) delete process.env[name]
          else process.env[name] = value
        }
      } else {
        await runCell(String(request.code ?? ''))
      }
    } catch (error) {
      reportError(error)
    }
    interrupt = null
    emit({ type: 'done' })
  })
})
requests.on('close', () => process.exit(0))
