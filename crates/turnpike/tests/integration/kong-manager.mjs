// Drives Kong Manager (Kong's admin web UI) in headless Chromium against a running Turnpike,
// for the `kong_manager` integration test: every list page loads without a failed Admin API
// request, then a service, a route, a consumer with a key-auth key and a plugin are created
// through the forms. Prints one JSON line of results. With SCREENSHOTS set, saves each page.
const puppeteer = (await import(process.env.PUPPETEER)).default;
const gui = process.env.GUI_URL, admin = process.env.ADMIN_URL, upstream = process.env.UPSTREAM_URL;
const shots = process.env.SCREENSHOTS;
const browser = await puppeteer.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', '--headless=new'],
});
const page = await browser.newPage();
await page.setViewport({width: 1400, height: 900});
const failures = [], writes = [], pages = {}, steps = {};
page.on('response', r => {
  if (!r.url().startsWith(admin)) return;
  const m = r.request().method();
  if (r.status() >= 400) failures.push(`${m} ${new URL(r.url()).pathname} ${r.status()}`);
  if (['POST', 'PUT', 'PATCH'].includes(m)) writes.push(`${m} ${new URL(r.url()).pathname} ${r.status()}`);
});
// Requests to the Admin API that never got an answer (CORS refusals show up here).
page.on('requestfailed', r => r.url().startsWith(admin) && failures.push(`${r.method()} ${r.url()} ${r.failure()?.errorText}`));
page.on('pageerror', e => failures.push(`pageerror ${e.message}`));
const sleep = ms => new Promise(r => setTimeout(r, ms));
const type = async (sel, text) => {
  await page.waitForSelector(sel, {visible: true, timeout: 20000});
  await page.click(sel, {clickCount: 3});
  await page.type(sel, text);
};
const submit = async sel => {
  await page.waitForSelector(sel + ':not([disabled])', {timeout: 20000});
  await page.click(sel);
  await sleep(1500);
};
const step = async (name, f) => {
  try { await f(); steps[name] = 'ok'; } catch (e) { steps[name] = e.message; }
};

for (const p of ['/', '/services', '/routes', '/consumers', '/plugins', '/upstreams', '/certificates',
                 '/ca-certificates', '/snis', '/key-sets', '/vaults']) {
  const before = failures.length;
  await page.goto(gui + p, {waitUntil: 'networkidle0', timeout: 30000});
  await sleep(300);
  pages[p] = failures.slice(before);
}
await step('service', async () => {
  await page.goto(gui + '/services/create', {waitUntil: 'networkidle0'});
  await type('[data-testid="gateway-service-name-input"]', 'km-svc');
  await type('[data-testid="gateway-service-url-input"]', upstream);
  await submit('[data-testid="service-create-form-submit"]');
});
await step('route', async () => {
  await page.goto(gui + '/routes/create', {waitUntil: 'networkidle0'});
  await type('[data-testid="route-form-name"]', 'km-route');
  // The service picker lists services by id; pick ours.
  await page.click('[data-testid="route-form-service-id"]');
  await page.waitForSelector('[data-testid^="select-item-"]', {visible: true, timeout: 20000});
  const picked = await page.$$eval('[data-testid^="select-item-"]', els => {
    const item = els.find(e => e.textContent.includes('km-svc'));
    (item.querySelector('button') || item).click();
    return item.getAttribute('data-testid');
  });
  if (!picked) throw new Error('km-svc not offered');
  await sleep(300);
  await type('[data-testid="route-form-paths-input-1"]', '/km');
  await submit('[data-testid="route-create-form-submit"]');
});
await step('consumer', async () => {
  await page.goto(gui + '/consumers/create', {waitUntil: 'networkidle0'});
  await type('[data-testid="consumer-form-username"]', 'km-user');
  await submit('[data-testid="consumer-create-form-submit"]');
});
await step('plugin', async () => {
  await page.goto(gui + '/plugins/key-auth/create', {waitUntil: 'networkidle0'});
  await sleep(1000);
  await submit('[data-testid="plugin-create-form-submit"]');
});
await step('credential', async () => {
  const c = await (await fetch(admin + '/consumers/km-user')).json();
  await page.goto(gui + `/consumers/${c.id}/credentials/key-auth/create`, {waitUntil: 'networkidle0'});
  await sleep(1000);
  await type('input#key', 'km-secret');
  await submit('[data-testid="plugin-create-form-submit"]');
});
if (shots) {
  for (const [p, name] of [['/', 'overview'], ['/services', 'services'], ['/routes', 'routes'],
                           ['/consumers', 'consumers'], ['/plugins', 'plugins']]) {
    await page.goto(gui + p, {waitUntil: 'networkidle0'});
    await sleep(500);
    await page.screenshot({path: `${shots}/kong-manager-${name}.png`});
  }
}
console.log(JSON.stringify({pages, steps, writes, failures}));
await browser.close();
