/**
 * Where a draft directory's files come from: the local disk (Node, Electron) or URLs (browsers,
 * React Native, a CDN). The model code reads through this interface only, so one code base
 * runs on every platform and a browser bundle never pulls in `node:fs`.
 */

export interface DraftFiles {
  /** The file's bytes; throws when it is missing. */
  bytes(name: string): Promise<Uint8Array>;
  /** The file's text (UTF-8), or null when the directory has no such file (optional files). */
  text(name: string): Promise<string | null>;
  /** Where the files are, for error messages. */
  readonly where: string;
}

/** A draft directory on the local disk (Node, Electron's main process). */
export function nodeFiles(dir: string): DraftFiles {
  // NOTE: imported on use, so bundlers for the browser never need node:fs.
  const fs = () => import("node:fs/promises");
  const join = (name: string) => (dir.endsWith("/") ? dir + name : `${dir}/${name}`);
  return {
    where: dir,
    async bytes(name) {
      return new Uint8Array(await (await fs()).readFile(join(name)));
    },
    async text(name) {
      try {
        return await (await fs()).readFile(join(name), "utf8");
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code === "ENOENT") return null;
        throw error;
      }
    },
  };
}

/** A draft directory served over HTTP(S): `baseUrl` + file name (browsers, React Native). */
export function urlFiles(baseUrl: string, fetchImpl: typeof fetch = globalThis.fetch): DraftFiles {
  const base = baseUrl.endsWith("/") ? baseUrl : baseUrl + "/";
  const get = async (name: string) => {
    const response = await fetchImpl(base + name);
    return response;
  };
  return {
    where: base,
    async bytes(name) {
      const response = await get(name);
      if (!response.ok) throw new Error(`${base}${name}: HTTP ${response.status}; the draft directory is incomplete`);
      return new Uint8Array(await response.arrayBuffer());
    },
    async text(name) {
      const response = await get(name);
      if (response.status === 404) return null;
      if (!response.ok) throw new Error(`${base}${name}: HTTP ${response.status}`);
      return await response.text();
    },
  };
}

/** A draft's files held in memory (tests, or an app that ships them in its bundle). */
export function memoryFiles(files: Record<string, Uint8Array | string>, where = "memory"): DraftFiles {
  return {
    where,
    async bytes(name) {
      const file = files[name];
      if (file === undefined) throw new Error(`${where}/${name} not found; the draft directory is incomplete`);
      return typeof file === "string" ? new TextEncoder().encode(file) : file;
    },
    async text(name) {
      const file = files[name];
      if (file === undefined) return null;
      return typeof file === "string" ? file : new TextDecoder().decode(file);
    },
  };
}

/** Lower-case hex SHA-256 through WebCrypto (Node >= 20 and browsers; React Native: pass your own). */
export async function sha256Hex(data: Uint8Array): Promise<string> {
  const subtle = globalThis.crypto?.subtle;
  if (!subtle) {
    throw new Error("crypto.subtle is not available here (React Native: install a WebCrypto polyfill or pass sha256 to loadDraft)");
  }
  const digest = new Uint8Array(await subtle.digest("SHA-256", data as BufferSource));
  return Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
}
