// Where and how to connect: address, TLS, token; and the gRPC transport for it.
import { readFileSync } from "node:fs";
import type { Transport } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { ConfigError } from "./errors.js";

export interface ClientOptions {
  /** "host:port" (plaintext), "http://host:port" or "https://host:port". Default
   * 127.0.0.1:50051. */
  address?: string;
  /** A bearer token the server accepts. */
  token?: string;
  /** TLS; implied by an https:// address or a CA. */
  tls?: boolean;
  /** PEM of the CA that signs the server's certificate (without it the system roots verify
   * the server). */
  ca?: string | Buffer;
  /** A file holding that PEM. */
  caFile?: string;
  /** Bound on each call other than the waits (which get their wait plus 5 s). Default 10 s. */
  timeoutMs?: number;
  /** Decision receipts must chain to the key set with this fingerprint (`countersign keys`);
   * without it, to the key set the server serves. */
  receiptPin?: string;
}

export interface Connection {
  baseUrl: string;
  tls: boolean;
  ca: Buffer | undefined;
  token: string | undefined;
  timeoutMs: number;
}

/** Checks and normalises the options; ConfigError says what is wrong. */
export function connectionOf(options: ClientOptions): Connection {
  let address = options.address ?? "127.0.0.1:50051";
  let tls = options.tls;
  const scheme = /^([a-z]+):\/\//.exec(address);
  if (scheme) {
    if (scheme[1] !== "http" && scheme[1] !== "https") {
      throw new ConfigError(`server address ${address} must be host:port, http:// or https://`);
    }
    const https = scheme[1] === "https";
    if (tls !== undefined && tls !== https) {
      throw new ConfigError(`tls: ${tls} contradicts the address ${address}`);
    }
    tls = https;
    address = address.slice(scheme[0].length).replace(/\/+$/, "");
  }
  if (!/^[^\s/]+:\d+$/.test(address)) {
    throw new ConfigError(`server address ${JSON.stringify(address)} must name a host and a port`);
  }
  let ca: Buffer | undefined;
  if (options.ca !== undefined && options.caFile !== undefined) {
    throw new ConfigError("pass ca or caFile, not both");
  }
  if (options.caFile !== undefined) {
    try {
      ca = readFileSync(options.caFile);
    } catch (error) {
      throw new ConfigError(`CA file ${options.caFile}: ${(error as Error).message}`);
    }
  } else if (options.ca !== undefined) {
    ca = Buffer.from(options.ca);
  }
  if (ca !== undefined) {
    if (tls === false) {
      // Refuse rather than silently talk plaintext to a server meant to be verified.
      throw new ConfigError("a CA is configured but TLS is off; use https:// or tls: true");
    }
    if (!ca.includes("-----BEGIN CERTIFICATE-----")) {
      throw new ConfigError("the CA holds no PEM certificate");
    }
    tls = true;
  }
  const token = options.token;
  if (token !== undefined && (token === "" || /[\r\n\0]/.test(token))) {
    throw new ConfigError("the token is empty or contains characters not allowed in a header");
  }
  const timeoutMs = options.timeoutMs ?? 10_000;
  if (!(timeoutMs > 0)) {
    throw new ConfigError(`timeoutMs must be positive, not ${timeoutMs}`);
  }
  return {
    baseUrl: `${tls ? "https" : "http"}://${address}`,
    tls: Boolean(tls),
    ca,
    token,
    timeoutMs,
  };
}

/** A new gRPC transport for the connection: one HTTP/2 session, pinged while streams are open
 * so that a dead connection under a long-poll is noticed. */
export function transportOf(connection: Connection): Transport {
  const { token } = connection;
  return createGrpcTransport({
    baseUrl: connection.baseUrl,
    nodeOptions: connection.ca === undefined ? {} : { ca: connection.ca },
    pingIntervalMs: 30_000,
    pingTimeoutMs: 10_000,
    interceptors:
      token === undefined
        ? []
        : [
            (next) => (request) => {
              request.header.set("authorization", `Bearer ${token}`);
              return next(request);
            },
          ],
  });
}
