/**
 * Messages a stream received, waiting to be read: a transport pushes them as they arrive and
 * ends the queue with its status; a reader waits for the next with a timeout.
 */

import { Code, ReplyTimeout, StatusError } from "../errors.js";

export class MessageQueue<T> {
  private items: T[] = [];
  private ended: StatusError | null | undefined = undefined; // undefined: open; null: ended cleanly
  private waiter: (() => void) | null = null;

  push(item: T): void {
    if (this.ended !== undefined) return;
    this.items.push(item);
    this.wake();
  }

  /** The stream ended: with `status` (an error), or cleanly (null). The first end wins. */
  end(status: StatusError | null): void {
    if (this.ended !== undefined) return;
    this.ended = status;
    this.wake();
  }

  get isEnded(): boolean {
    return this.ended !== undefined;
  }

  get endStatus(): StatusError | null | undefined {
    return this.ended;
  }

  /** The next item; null after a clean end; rejects with the end's status or a ReplyTimeout. */
  async next(timeoutS: number): Promise<T | null> {
    while (this.items.length === 0 && this.ended === undefined) {
      await new Promise<void>((resolve, reject) => {
        const timer = setTimeout(() => {
          this.waiter = null;
          reject(new ReplyTimeout(timeoutS));
        }, timeoutS * 1000);
        this.waiter = () => {
          clearTimeout(timer);
          resolve();
        };
      });
    }
    if (this.items.length > 0) return this.items.shift()!;
    if (this.ended) throw this.ended;
    return null;
  }

  /** As `next`, but a clean end is a stream that ended early (UNAVAILABLE), as a Session never ends before its reply. */
  async nextOrFail(timeoutS: number): Promise<T> {
    const item = await this.next(timeoutS);
    if (item === null) throw new StatusError(Code.UNAVAILABLE, "the server ended the session stream unexpectedly");
    return item;
  }

  private wake(): void {
    const waiter = this.waiter;
    this.waiter = null;
    waiter?.();
  }
}
