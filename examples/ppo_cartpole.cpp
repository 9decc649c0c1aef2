// PPO on CartPole-v1, written with kiln's eager API: vectorized environments, GAE, a clipped
// surrogate objective with value loss and entropy bonus, minibatch epochs of Adam.
//
//   ppo_cartpole [--seed N] [--steps N] [--min-return R] [--no-early-stop]
//
// Trains until `--steps` environment steps, or until the mean return of the last 20 episodes
// reaches 475 (CartPole-v1's "solved" threshold; unless --no-early-stop). The last line printed
// is `final mean return: X`; with --min-return the exit status is 1 if X < R.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cartpole.h"
#include "kiln.h"

namespace nn = kiln::nn;
namespace optim = kiln::optim;
using kiln::Tensor;

namespace {

struct Config {
  uint64_t seed = 1;
  int64_t total_steps = 200000;  // environment steps (summed over the vectorized envs)
  double min_return = -1;  // exit status 1 if the final mean return is below this
  bool early_stop = true;  // stop once the solved criterion is met

  int num_envs = 8;
  int rollout_len = 128;  // steps per env per rollout (batch = num_envs * rollout_len)
  int epochs = 10;
  int minibatches = 4;
  int hidden = 64;
  double lr = 1e-3;  // annealed linearly to 0 over total_steps
  double gamma = 0.99, gae_lambda = 0.95;
  double clip = 0.2, ent_coef = 0.0, vf_coef = 0.5, max_grad_norm = 0.5;

  int window = 20;  // episodes in the reported mean return
  double solved_return = 475;  // the criterion for early stopping
};

[[noreturn]] void usage(const char* prog) {
  std::fprintf(stderr, "usage: %s [--seed N] [--steps N] [--min-return R] [--no-early-stop]\n", prog);
  std::exit(2);
}

Config parse_args(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage(argv[0]);
      return argv[++i];
    };
    if (a == "--seed")
      c.seed = std::strtoull(value(), nullptr, 10);
    else if (a == "--steps")
      c.total_steps = std::strtoll(value(), nullptr, 10);
    else if (a == "--min-return")
      c.min_return = std::strtod(value(), nullptr);
    else if (a == "--no-early-stop")
      c.early_stop = false;
    else
      usage(argv[0]);
  }
  return c;
}

// ---------- networks ----------

// A Linear layer with orthogonal weights (scaled by `gain`) and zero bias, the usual PPO init.
std::shared_ptr<nn::Linear> ortho_linear(int64_t in, int64_t out, double gain) {
  auto l = std::make_shared<nn::Linear>(in, out);
  nn::orthogonal_(l->weight, gain);
  nn::constant_(l->bias, 0);
  return l;
}

// in -> hidden -> tanh -> hidden -> tanh -> out.
std::shared_ptr<nn::Sequential> mlp(int64_t in, int64_t hidden, int64_t out, double out_gain) {
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(ortho_linear(in, hidden, std::sqrt(2.0)))
      .push_back(std::make_shared<nn::Tanh>())
      .push_back(ortho_linear(hidden, hidden, std::sqrt(2.0)))
      .push_back(std::make_shared<nn::Tanh>())
      .push_back(ortho_linear(hidden, out, out_gain));
  return net;
}

struct ActorCritic {
  std::shared_ptr<nn::Sequential> actor;  // observation -> action logits
  std::shared_ptr<nn::Sequential> critic;  // observation -> state value

  ActorCritic(int64_t obs_dim, int64_t num_actions, int64_t hidden)
      : actor(mlp(obs_dim, hidden, num_actions, 0.01)), critic(mlp(obs_dim, hidden, 1, 1.0)) {}

  std::vector<Tensor> parameters() const {
    std::vector<Tensor> p = actor->parameters();
    for (auto& t : critic->parameters()) p.push_back(t);
    return p;
  }
};

// ---------- acting ----------

// Log-probabilities of every action [n, A] and state values [n] for a batch of observations,
// computed in one materialization.
struct PolicyStep {
  std::vector<float> logp;
  std::vector<float> value;
};

PolicyStep evaluate_policy(ActorCritic& ac, const std::vector<float>& obs, int64_t n) {
  kiln::NoGradGuard no_grad;
  Tensor x = kiln::from_vector(obs, std::vector<int64_t>{n, cartpole::CartPole::kObsDim});
  Tensor logp = kiln::log_softmax(ac.actor->forward(x), -1);
  Tensor value = ac.critic->forward(x).squeeze(-1);
  kiln::eval({logp, value});
  return {logp.to_vector<float>(), value.to_vector<float>()};
}

// Samples an action from the categorical distribution with log-probabilities `logp`.
int64_t sample_action(const float* logp, int num_actions, std::mt19937_64& rng) {
  double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng), cum = 0;
  for (int a = 0; a < num_actions - 1; ++a) {
    cum += std::exp(static_cast<double>(logp[a]));
    if (u < cum) return a;
  }
  return num_actions - 1;
}

// ---------- rollouts and GAE ----------

// One rollout, time-major: entry t * num_envs + i is env i at step t.
struct Rollout {
  std::vector<float> obs;  // [T * N, obs_dim]
  std::vector<int64_t> actions;
  std::vector<float> logprobs, values, rewards;
  std::vector<uint8_t> dones;  // the episode ended after this step
  std::vector<float> last_values;  // V(obs) after the last step, per env
  std::vector<float> advantages, returns;

  void clear() {
    obs.clear();
    actions.clear();
    logprobs.clear();
    values.clear();
    rewards.clear();
    dones.clear();
  }
  int64_t size() const { return static_cast<int64_t>(actions.size()); }
};

// Tracks finished episodes and the mean return of the most recent ones.
struct EpisodeLog {
  std::deque<double> recent;
  int64_t episodes = 0;
  int window;
  explicit EpisodeLog(int w) : window(w) {}
  void add(double ret) {
    recent.push_back(ret);
    if (static_cast<int>(recent.size()) > window) recent.pop_front();
    ++episodes;
  }
  double mean() const {
    return recent.empty() ? 0.0 : std::accumulate(recent.begin(), recent.end(), 0.0) / recent.size();
  }
  bool full() const { return static_cast<int>(recent.size()) == window; }
};

// Steps the envs for one rollout with the current policy. A truncated (time-limit) episode is
// bootstrapped: its last reward gets gamma * V(final observation) added, then it counts as done.
// Returns early (with a partial rollout) if `stop` says so after an episode ends.
template <class StopFn>
void collect_rollout(ActorCritic& ac, cartpole::VecCartPole& envs, const Config& cfg, std::mt19937_64& rng, Rollout& ro,
                     EpisodeLog& log, int64_t& env_steps, StopFn stop) {
  constexpr int A = cartpole::CartPole::kNumActions;
  const int n = envs.size();
  ro.clear();
  std::vector<int64_t> actions(n);
  for (int t = 0; t < cfg.rollout_len; ++t) {
    PolicyStep ps = evaluate_policy(ac, envs.obs(), n);
    for (int i = 0; i < n; ++i) {
      actions[i] = sample_action(&ps.logp[size_t(i) * A], A, rng);
      ro.logprobs.push_back(ps.logp[size_t(i) * A + actions[i]]);
    }
    ro.obs.insert(ro.obs.end(), envs.obs().begin(), envs.obs().end());
    ro.actions.insert(ro.actions.end(), actions.begin(), actions.end());
    ro.values.insert(ro.values.end(), ps.value.begin(), ps.value.end());

    cartpole::VecCartPole::Step s = envs.step(actions);
    env_steps += n;
    std::vector<float> truncated_obs;
    std::vector<int> truncated_envs;
    for (int i = 0; i < n; ++i) {
      ro.rewards.push_back(s.rewards[i]);
      ro.dones.push_back(s.terminated[i] || s.truncated[i]);
      if (s.truncated[i]) {
        truncated_envs.push_back(i);
        truncated_obs.insert(truncated_obs.end(), s.final_obs[i].begin(), s.final_obs[i].end());
      }
    }
    if (!truncated_envs.empty()) {  // rare: once per 500 steps per env at most
      PolicyStep fin = evaluate_policy(ac, truncated_obs, static_cast<int64_t>(truncated_envs.size()));
      for (size_t k = 0; k < truncated_envs.size(); ++k)
        ro.rewards[size_t(t) * n + truncated_envs[k]] += static_cast<float>(cfg.gamma * fin.value[k]);
    }
    for (double r : s.finished_returns) log.add(r);
    if (!s.finished_returns.empty() && stop()) return;
  }
  ro.last_values = evaluate_policy(ac, envs.obs(), n).value;
}

// Generalized advantage estimation over the rollout (per env, backwards in time).
void compute_gae(Rollout& ro, int num_envs, double gamma, double lambda) {
  const int64_t T = ro.size() / num_envs;
  ro.advantages.assign(ro.size(), 0.f);
  ro.returns.assign(ro.size(), 0.f);
  for (int i = 0; i < num_envs; ++i) {
    double gae = 0;
    for (int64_t t = T - 1; t >= 0; --t) {
      const size_t k = size_t(t) * num_envs + i;
      const double next_value = t == T - 1 ? ro.last_values[i] : ro.values[k + num_envs];
      const double not_done = ro.dones[k] ? 0.0 : 1.0;
      const double delta = ro.rewards[k] + gamma * next_value * not_done - ro.values[k];
      gae = delta + gamma * lambda * not_done * gae;
      ro.advantages[k] = static_cast<float>(gae);
      ro.returns[k] = static_cast<float>(gae + ro.values[k]);
    }
  }
}

// ---------- the PPO update ----------

// The rollout as tensors, indexed by sample.
struct Batch {
  Tensor obs, actions, logprobs, advantages, returns;

  Batch select(const Tensor& idx) const {
    return {obs.index_select(0, idx), actions.index_select(0, idx), logprobs.index_select(0, idx),
            advantages.index_select(0, idx), returns.index_select(0, idx)};
  }
};

Batch to_batch(const Rollout& ro) {
  const int64_t n = ro.size();
  return {kiln::from_vector(ro.obs, std::vector<int64_t>{n, cartpole::CartPole::kObsDim}),
          kiln::from_vector(ro.actions), kiln::from_vector(ro.logprobs), kiln::from_vector(ro.advantages),
          kiln::from_vector(ro.returns)};
}

struct Losses {
  Tensor total, policy, value, entropy;
};

// Clipped surrogate objective + value regression - entropy bonus, on one minibatch.
Losses ppo_loss(ActorCritic& ac, const Batch& mb, const Config& cfg) {
  Tensor logp_all = kiln::log_softmax(ac.actor->forward(mb.obs), -1);
  Tensor logp = logp_all.gather(1, mb.actions.unsqueeze(1)).squeeze(1);
  Tensor ratio = (logp - mb.logprobs).exp();
  Tensor adv = (mb.advantages - mb.advantages.mean()) / (mb.advantages.std() + 1e-8);
  Tensor policy_loss = kiln::maximum(-adv * ratio, -adv * ratio.clamp(1 - cfg.clip, 1 + cfg.clip)).mean();
  Tensor value = ac.critic->forward(mb.obs).squeeze(-1);
  Tensor value_loss = 0.5 * (value - mb.returns).square().mean();
  Tensor entropy = -(logp_all.exp() * logp_all).sum({-1}).mean();
  Tensor total = policy_loss + cfg.vf_coef * value_loss - cfg.ent_coef * entropy;
  return {total, policy_loss, value_loss, entropy};
}

// Epochs of shuffled minibatch updates. Each optimizer step is materialized once (no item()
// calls); returns the losses of the last minibatch (already computed, for logging).
Losses update(ActorCritic& ac, optim::Adam& opt, const Rollout& ro, const Config& cfg, std::mt19937_64& rng) {
  const Batch batch = to_batch(ro);
  const std::vector<Tensor> params = ac.parameters();
  const int64_t n = ro.size(), mb_size = n / cfg.minibatches;
  std::vector<int64_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  Losses last;
  for (int epoch = 0; epoch < cfg.epochs; ++epoch) {
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t start = 0; start + mb_size <= n; start += mb_size) {
      Tensor idx = kiln::from_vector(std::vector<int64_t>(perm.begin() + start, perm.begin() + start + mb_size));
      last = ppo_loss(ac, batch.select(idx), cfg);
      opt.zero_grad();
      last.total.backward();
      optim::clip_grad_norm_(params, cfg.max_grad_norm);
      opt.step();
      kiln::eval(params);
    }
  }
  return last;
}

}  // namespace

int main(int argc, char** argv) {
  const Config cfg = parse_args(argc, argv);
  kiln::manual_seed(cfg.seed);
  std::mt19937_64 rng(cfg.seed);  // action sampling and minibatch shuffling

  cartpole::VecCartPole envs(cfg.num_envs, cfg.seed);
  ActorCritic ac(cartpole::CartPole::kObsDim, cartpole::CartPole::kNumActions, cfg.hidden);
  optim::Adam opt(ac.parameters(), {.lr = cfg.lr, .eps = 1e-5});

  std::printf("PPO on CartPole-v1: seed %llu, %lld steps, %d envs x %d steps per rollout, %d epochs x %d minibatches\n",
              static_cast<unsigned long long>(cfg.seed), static_cast<long long>(cfg.total_steps), cfg.num_envs,
              cfg.rollout_len, cfg.epochs, cfg.minibatches);

  EpisodeLog log(cfg.window);
  Rollout ro;
  int64_t env_steps = 0, solved_at = -1;  // env steps when the criterion was first met
  double solved_time = 0;
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  auto stop = [&] {
    if (solved_at < 0 && log.full() && log.mean() >= cfg.solved_return) {
      solved_at = env_steps;
      solved_time = elapsed();
    }
    return cfg.early_stop && solved_at >= 0;
  };
  auto progress = [&](const Losses* l) {
    std::printf("steps %7lld  episodes %5lld  mean return (last %d) %6.1f", static_cast<long long>(env_steps),
                static_cast<long long>(log.episodes), cfg.window, log.mean());
    if (l)
      std::printf("  loss pi %+.4f v %.3f ent %.3f", l->policy.item<float>(), l->value.item<float>(),
                  l->entropy.item<float>());
    std::printf("  %.0f steps/s\n", env_steps / elapsed());
    std::fflush(stdout);
  };

  const int64_t per_rollout = int64_t(cfg.num_envs) * cfg.rollout_len;
  const int64_t num_rollouts = (cfg.total_steps + per_rollout - 1) / per_rollout;
  double acting_s = 0, learning_s = 0;  // wall time in rollouts / in updates
  for (int64_t r = 0; r < num_rollouts; ++r) {
    opt.set_lr(cfg.lr * (1.0 - static_cast<double>(r) / num_rollouts));
    const double ta = elapsed();
    collect_rollout(ac, envs, cfg, rng, ro, log, env_steps, stop);
    const double tb = elapsed();
    acting_s += tb - ta;
    if (stop()) break;
    compute_gae(ro, cfg.num_envs, cfg.gamma, cfg.gae_lambda);
    Losses l = update(ac, opt, ro, cfg, rng);
    learning_s += elapsed() - tb;
    if ((r + 1) % 10 == 0) progress(&l);
  }
  progress(nullptr);
  std::printf("time: %.1f s acting, %.1f s learning\n", acting_s, learning_s);
  if (solved_at >= 0)
    std::printf("solved (mean return of the last %d episodes >= %.0f) at %lld steps, %.1f s\n", cfg.window,
                cfg.solved_return, static_cast<long long>(solved_at), solved_time);
  const double final_return = log.mean();
  const bool ok = final_return >= cfg.min_return;
  if (!ok) std::printf("FAILED: final mean return below --min-return %.1f\n", cfg.min_return);
  std::printf("final mean return: %.2f\n", final_return);
  return ok ? 0 : 1;
}
