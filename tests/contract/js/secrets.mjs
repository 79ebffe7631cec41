// E2B's secrets with the unmodified E2B JS SDK (e2b@2.51.0): Secret.create, getInfo by id
// and by name, update (a new version), list with paging, exists, destroy, another team's
// secret as not found, and no answer holding the value.
//
// Reads E2B_API_URL, E2B_API_KEY and OTHER_API_KEY from the environment; prints
// "secrets.mjs: ok" when every step matched. Run by tests/contract/test_secrets_sdk.py.
import assert from 'node:assert/strict'
import { Secret, SecretNotFoundError } from 'e2b'

for (const name of ['E2B_API_URL', 'E2B_API_KEY', 'OTHER_API_KEY']) {
  if (!process.env[name]) {
    console.error(`secrets.mjs: set ${name}`)
    process.exit(2)
  }
}

const VALUE = 'js-sdk-value-4c1d9e-never-shown'
const suffix = Math.random().toString(36).slice(2, 8)
const name = `JS-Key-${suffix}`
const other = { apiKey: process.env.OTHER_API_KEY }

const created = await Secret.create(name, VALUE, { metadata: { sdk: 'js' } })
assert.ok(created.secretId.startsWith('sec_'), created.secretId)
assert.equal(created.name, name.toLowerCase())
assert.equal(created.version, 1)
assert.deepEqual(created.metadata, { sdk: 'js' })
assert.ok(created.createdAt instanceof Date)
assert.equal(JSON.stringify(created).includes(VALUE), false)

const byName = await Secret.getInfo(name)
assert.equal(byName.secretId, created.secretId)
const updated = await Secret.update(created.secretId, VALUE + '-2')
assert.equal(updated.version, 2)

await Secret.create(`js-second-${suffix}`, VALUE)
const paginator = Secret.list({ limit: 1 })
const seen = []
while (paginator.hasNext) {
  seen.push(...(await paginator.nextItems()))
}
assert.ok(seen.some((s) => s.secretId === created.secretId))
assert.ok(seen.some((s) => s.name === `js-second-${suffix}`))

assert.equal(await Secret.exists(created.secretId, other), false)
await assert.rejects(Secret.getInfo(name, other), SecretNotFoundError)
assert.equal(await Secret.destroy(name, other), false)

assert.equal(await Secret.destroy(created.secretId), true)
assert.equal(await Secret.exists(created.secretId), false)
await assert.rejects(Secret.update(name, 'x'), SecretNotFoundError)
assert.equal(await Secret.destroy(`js-second-${suffix}`), true)
console.log('secrets.mjs: ok')
