/**
 * Incremental detokenisation (edge/detok.py): each push decodes every generated id and emits only
 * the new, complete suffix; an incomplete character (U+FFFD at the end) waits for the next push.
 */

const REPLACEMENT = "\ufffd";

export class IncrementalDecoder {
  private readonly ids: number[] = [];
  private emitted = 0;

  constructor(private readonly decode: (ids: readonly number[]) => string) {}

  push(tokenIds: readonly number[]): string {
    this.ids.push(...tokenIds);
    const text = this.decode(this.ids);
    if (text.endsWith(REPLACEMENT)) return "";
    const piece = text.slice(this.emitted);
    this.emitted = text.length;
    return piece;
  }

  flush(): string {
    const text = this.decode(this.ids);
    const piece = text.slice(this.emitted);
    this.emitted = text.length;
    return piece;
  }

  get text(): string {
    return this.decode(this.ids);
  }
}
