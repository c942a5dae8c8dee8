/// <reference types="vitest/config" />
import { defineConfig } from "vite";
import react from "@vitejs/plugin-react";

// The Django server serves dist/index.html for every client-side route and
// dist/app-assets/* at /app-assets/* (WhiteNoise, WHITENOISE_ROOT=frontend/dist).
// `npm run dev` / `vite preview` proxy the server's paths to TRAINYARD_DEV_BACKEND.
// With TRAINYARD_DEV_TOKEN set they also sign proxied requests with that API
// token: a way to look at a server's data without signing in to it.
const backend = process.env.TRAINYARD_DEV_BACKEND ?? "http://127.0.0.1:8000";
const token = process.env.TRAINYARD_DEV_TOKEN;
const headers = token ? { Authorization: `Bearer ${token}` } : undefined;
const proxied = { target: backend, headers };

export default defineConfig({
  plugins: [react()],
  base: "/",
  build: {
    outDir: "dist",
    assetsDir: "app-assets",
    emptyOutDir: true,
    sourcemap: false,
  },
  server: {
    proxy: {
      "/api": proxied,
      "/auth": proxied,
      "/admin": proxied,
      "/storage": proxied,
      "/static": proxied,
      "/ws": {
        ...proxied,
        ws: true,
        // The server checks a websocket's Origin against its own host.
        configure: (proxy) => proxy.on("proxyReqWs", (request) => request.setHeader("Origin", backend)),
      },
    },
  },
  test: {
    environment: "jsdom",
    globals: true,
    setupFiles: ["src/test/setup.ts"],
    css: false,
  },
});
