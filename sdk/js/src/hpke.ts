/**
 * The one HPKE suite of sealed payloads (RFC 9180 base mode, single shot): DHKEM(X25519,
 * HKDF-SHA256), HKDF-SHA256, ChaCha20-Poly1305, with @hpke/core and its X25519 and
 * ChaCha20-Poly1305 modules (the Python SDK's `client/sealed.py` suite). sealed.ts imports
 * this module only when a policy has a shuffle section, so pages without one never load it
 * (a separate chunk of the browser bundles). The ephemeral key comes from the platform
 * CSPRNG inside @hpke/core, unless `ikmE` (conformance vectors only) derives it.
 */
import { CipherSuite, HkdfSha256 } from "@hpke/core";
import { Chacha20Poly1305 } from "@hpke/chacha20poly1305";
import { DhkemX25519HkdfSha256 } from "@hpke/dhkem-x25519";

let suite: CipherSuite | undefined;

/** A fresh ArrayBuffer holding exactly `bytes` (importKey wants an ArrayBuffer). */
function buffer(bytes: Uint8Array): ArrayBuffer {
  return bytes.slice().buffer as ArrayBuffer;
}

/** enc || ciphertext of `plaintext` sealed to the raw X25519 `publicKey` with `info`. */
export async function hpkeSeal(publicKey: Uint8Array, info: Uint8Array, plaintext: Uint8Array, ikmE?: Uint8Array): Promise<Uint8Array> {
  suite ??= new CipherSuite({ kem: new DhkemX25519HkdfSha256(), kdf: new HkdfSha256(), aead: new Chacha20Poly1305() });
  const recipientPublicKey = await suite.kem.importKey("raw", buffer(publicKey), true);
  const sender = await suite.createSenderContext({ recipientPublicKey, info, ...(ikmE === undefined ? {} : { ekm: ikmE }) });
  const ciphertext = new Uint8Array(await sender.seal(plaintext));
  const enc = new Uint8Array(sender.enc);
  const out = new Uint8Array(enc.length + ciphertext.length);
  out.set(enc);
  out.set(ciphertext, enc.length);
  return out;
}

/** The plaintext inside `sealed` (enc || ciphertext) for the raw X25519 private key (tests). */
export async function hpkeOpen(privateKey: Uint8Array, info: Uint8Array, sealed: Uint8Array): Promise<Uint8Array> {
  suite ??= new CipherSuite({ kem: new DhkemX25519HkdfSha256(), kdf: new HkdfSha256(), aead: new Chacha20Poly1305() });
  const recipientKey = await suite.kem.importKey("raw", buffer(privateKey), false);
  const recipient = await suite.createRecipientContext({ recipientKey, enc: sealed.slice(0, 32), info });
  return new Uint8Array(await recipient.open(sealed.slice(32)));
}
