// Generates src/api/schema.d.ts from openapi.yaml (made by `manage.py spectacular`).
//
// Why the resolve hook: openapi-typescript builds its output with the classic
// TypeScript compiler API (`ts.factory`, `ts.createPrinter`), which TypeScript 7
// (the native port we type-check with) no longer ships. package.json installs
// TypeScript 5 under the alias `typescript-5`; here `import "typescript"` from
// inside openapi-typescript is redirected to it. Nothing else sees TypeScript 5.
import { register } from "node:module";

const hook = `
export async function resolve(specifier, context, next) {
  if (specifier === "typescript" && context.parentURL?.includes("/openapi-typescript/")) {
    return next("typescript-5", context);
  }
  return next(specifier, context);
}`;

register("data:text/javascript," + encodeURIComponent(hook), import.meta.url);
process.argv = [process.argv[0], "openapi-typescript", "openapi.yaml", "-o", "src/api/schema.d.ts"];
await import(new URL("../node_modules/openapi-typescript/bin/cli.js", import.meta.url).href);
