// Retry pacing shared by the waits and the watch, as in the Rust and Python clients.
import { Aborted } from "./errors.js";

/** Exponential backoff with jitter: each delay is drawn from [d/2, d] where d doubles after
 * every failure up to `maximumMs`. */
export class Backoff {
  static readonly INITIAL_MS = 100;
  private current = 0;
  /** Failures since the last success. */
  attempts = 0;

  constructor(private readonly maximumMs: number) {
    this.reset();
  }

  reset(): void {
    this.current = Math.min(Backoff.INITIAL_MS, this.maximumMs);
    this.attempts = 0;
  }

  nextDelayMs(): number {
    const ceiling = this.current;
    this.current = Math.min(this.current * 2, this.maximumMs);
    this.attempts += 1;
    return ceiling / 2 + Math.random() * (ceiling / 2);
  }

  /** The next delay, shortened so that it ends by `deadline` (a `performance.now()` time). */
  pauseUntil(deadline: number): number {
    return Math.max(0, Math.min(this.nextDelayMs(), deadline - performance.now()));
  }
}

/** Resolves after `ms`, or rejects with `Aborted` as soon as `signal` aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(new Aborted(`aborted: ${String(signal.reason)}`));
      return;
    }
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(new Aborted(`aborted: ${String(signal?.reason)}`));
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
